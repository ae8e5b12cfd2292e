"""Jars from Maven Central for what runs on the JVM beside vqueues: the local Apache Kafka
cluster and Spark's Kafka connector. A committed Maven file (a `*.pom.xml` in the package) pins
the versions; `mvn dependency:copy-dependencies` copies the jars into a cache on first use.

Maven does the resolving (transitive dependencies, exclusions, checksums), which is why this
asks `mvn` rather than downloading jars itself.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import re
import shutil
import subprocess
from pathlib import Path

log = logging.getLogger(__name__)

MIN_JAVA = 17


class JarsUnavailable(RuntimeError):
    """Java or Maven is missing, or Maven could not fetch the jars."""


def java(needed_by: str) -> str:
    """The `java` to run (JAVA_HOME first), checked to be 17 or newer."""
    home = os.environ.get("JAVA_HOME")
    path = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    if not path or not Path(path).exists():
        raise JarsUnavailable(f"{needed_by} needs Java {MIN_JAVA}+ (`java` not found)")
    out = subprocess.run([path, "-version"], capture_output=True, text=True, check=False).stderr
    found = re.search(r'version "(\d+)', out)
    if not found or int(found.group(1)) < MIN_JAVA:
        first = out.splitlines()[0] if out else "unknown"
        raise JarsUnavailable(f"{needed_by} needs Java {MIN_JAVA}+; {path} is {first}")
    return path


def cache_dir(pom: Path) -> Path:
    """Where a pom's jars go: VQ_KAFKA_CACHE, else ~/.cache/vqueues; one folder per pom's
    content, so a changed pom fetches afresh."""
    root = Path(os.environ.get("VQ_KAFKA_CACHE") or Path.home() / ".cache" / "vqueues")
    digest = hashlib.sha256(pom.read_bytes()).hexdigest()[:10]
    return root / f"{pom.name.removesuffix('.pom.xml')}-{digest}"


def fetch_jars(pom: Path) -> Path:
    """The folder holding the pom's jars (and their runtime dependencies), fetched by Maven the
    first time. Safe when several processes ask at once (a file lock)."""
    libs = cache_dir(pom) / "libs"
    done = libs / ".fetched"
    if done.exists():
        return libs
    mvn = shutil.which("mvn")
    if not mvn:
        raise JarsUnavailable(f"fetching the jars of {pom.name} needs Maven (`mvn` not found)")
    libs.parent.mkdir(parents=True, exist_ok=True)
    with open(libs.parent / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if done.exists():
            return libs
        partial = libs.with_name("libs.partial")
        shutil.rmtree(partial, ignore_errors=True)
        log.info("jars_fetching", extra={"pom": str(pom), "into": str(libs)})
        run = subprocess.run(
            [mvn, "-q", "-B", "-f", str(pom), "dependency:copy-dependencies",
             "-DincludeScope=runtime", f"-DoutputDirectory={partial}"],
            capture_output=True, text=True, check=False)
        if run.returncode != 0:
            tail = "\n".join((run.stdout + run.stderr).splitlines()[-15:])
            raise JarsUnavailable(f"Maven could not fetch the jars of {pom.name}:\n{tail}")
        shutil.rmtree(libs, ignore_errors=True)
        partial.rename(libs)
        done.touch()
    return libs
