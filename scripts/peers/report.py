"""The tables (markdown) and the charts (PNG) of a scripts/bench_peers.py run."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any


def _first_line(argv: list[str]) -> str:
    try:
        run = subprocess.run(argv, capture_output=True, text=True, timeout=20, check=False)
        return (run.stdout or run.stderr).strip().splitlines()[0]
    except (OSError, IndexError, subprocess.TimeoutExpired):
        return "not installed"


def _package(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"


def machine() -> dict[str, Any]:
    """What ran the comparison: the CPU, memory, and every server's and client's version."""
    cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text()
                .splitlines() if ln.startswith("model name")), platform.processor())
    mem_kb = next(int(ln.split()[1]) for ln in Path("/proc/meminfo").read_text().splitlines()
                  if ln.startswith("MemTotal"))
    import confluent_kafka

    from vqueues.kafka.local_cluster import KAFKA_VERSION
    rabbit = _first_line(["dpkg-query", "-W", "-f", "${Version}", "rabbitmq-server"]) \
        if shutil.which("dpkg-query") else "unknown"
    return {
        "cpu": cpu, "cores": os.cpu_count(), "memory_gib": round(mem_kb / 2**20, 1),
        "os": f"{platform.system()} {platform.release()}", "python": platform.python_version(),
        "servers": {
            "redis-server": _first_line(["redis-server", "--version"]),
            "nats-server": _first_line(["nats-server", "--version"]),
            "rabbitmq-server": rabbit,
            "apache kafka": KAFKA_VERSION,
            "java": _first_line(["java", "-version"]),
        },
        "clients": {"confluent-kafka": _package("confluent-kafka"),
                    "librdkafka": confluent_kafka.libversion()[0],  # what the wheel bundles
                    "redis-py": _package("redis"), "hiredis": _package("hiredis"),
                    "nats-py": _package("nats-py"), "aio-pika": _package("aio-pika"),
                    "aiohttp": _package("aiohttp"),
                    "vqueues_client": _package("vqueues-client")},
    }


def _n(v: Any, digits: int = 0) -> str:
    if v is None:
        return "–"
    if isinstance(v, float | int):
        return f"{v:,.{digits}f}"
    return str(v)


def headings(sz: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(figure key, heading, kind) per table, with the sizes the run used; kind picks the
    columns."""
    few, many = f"{sz['few_queues']:,}", f"{sz['many_queues']:,}"
    load = f"{sz['batch']}-record batches, {sz['producers']} producers"
    work = (f"Work queue: {sz['work_records']:,} records over {sz['work_queues']} queues, "
            f"{sz['workers']} workers")
    out = [("enqueue_few", f"Enqueue: {load}, {few} queues", "rate"),
           ("enqueue_many", f"Enqueue: {load}, {many} queues", "rate"),
           ("small_one", f"Small writes: one record to each of {many} queues, one call each, "
                         f"{sz['producers']} in flight", "rate"),
           ("small_batched", f"Small writes: one record to each of {many} queues through the "
                             "client's own batching", "rate"),
           ("e2e", "End to end: one write, to a reader parked on the queue", "latency")]
    out += [(f"work_{n}", f"{work}, {n} per call, acknowledged", "rate")
            for n in sz["per_call"]]
    return [
        *out,
        ("memory", f"Memory per queue: {many} queues × 2 records (server RSS)", "memory"),
        ("restart", "Restart: from the spawn to the first read of an old record, and to all "
                    f"queues ready ({many} queues × 2 records)", "restart")]


def _why_missing(e: dict[str, Any]) -> str:
    if "failed" in e:
        return f"not measured: the run failed before it ({e['failed']})"
    if e["figures"].get("restart", {}).get("note"):
        return "not measured: it follows the restart, which was not ready in time"
    return "not measured"


def _busy(f: dict[str, Any]) -> str:
    """The client's CPU over the run's wall time: at 100% (a core) the client, not the server,
    set the pace (its threads and child processes count too, so it can pass 100%)."""
    if not f.get("wall_s"):
        return "–"
    return f"{100 * f['client_cpu_s'] / f['wall_s']:.0f}%"


def _row_label(key: str, entry: dict[str, Any], fig_key: str) -> str:
    label = str(entry["label"])
    if fig_key == "work_worker":
        return f"{label}: `Worker`, 16 slots, no-op handler"
    if fig_key == "small_batched" and entry.get("batching_client"):
        return f"{label}: {entry['batching_client']}"
    return label


def _systems_as_run(systems: dict[str, Any], sz: dict[str, Any]) -> list[str]:
    """The section that says how each system was run."""
    lines = ["### The systems as run", ""]
    for e in systems.values():
        if "settings" not in e:
            continue
        lines.append(f"**{e['label']}**")
        lines.append("")
        lines += [f"- {s}" for s in e["settings"]]
        lines.append(f"- an acknowledged write: {e['durability']}")
        if e["few_queues"] == e["many_queues"]:
            lines.append(f"- queues: {e['few_queues']}")
        else:
            lines.append(f"- queues: {e['few_queues']}; with {sz['many_queues']:,}: "
                         f"{e['many_queues']}")
        lines.append(f"- work queue: {e['work']}")
        if e["batching_client"]:
            lines.append(f"- small writes batched by: {e['batching_client']}")
        lines.append(f"- restart: {e['restart']}")
        lines.append("")
    return lines


def tables(report: dict[str, Any]) -> str:
    m = report["machine"]
    lines = [f"Run {report['date']} on {m['cpu']}, {m['cores']} cores, {m['memory_gib']} GiB, "
             f"{m['os']}, Python {m['python']}; every server and this one client process on "
             "the same machine.", ""]
    systems = report["systems"]
    skipped = [f"{k}: {v['skipped']}" for k, v in systems.items() if "skipped" in v]
    failed = [f"{k}: {v['failed']}" for k, v in systems.items() if "failed" in v]
    if skipped:
        lines += ["Skipped: " + "; ".join(skipped) + ".", ""]
    if failed:
        lines += ["Failed: " + "; ".join(failed) + ".", ""]
    sz = report["sizes"]
    for fig_key, heading, kind in headings(sz):
        last_work = f"work_{sz['per_call'][-1]}"
        keys = [fig_key] + (["work_worker"] if fig_key == last_work else [])
        ran = [(k, e) for k, e in systems.items() if e.get("figures")]
        rows = [(k, e, fk) for k, e in ran for fk in keys if fk in e["figures"]]
        # A system that ran but has no figure here (its restart was not ready, or it failed
        # before) gets a row saying so; batching and Worker rows are only for who has them.
        missing = [] if fig_key == "small_batched" else \
            [(k, e) for k, e in ran if fig_key not in e["figures"]]
        if not rows:
            continue
        lines += [f"### {heading}", ""]
        if kind == "rate":
            lines += ["| system | records/s | calls/s | server CPU s | client CPU s | "
                      "client busy | records per server CPU-s | note |",
                      "|---|---:|---:|---:|---:|---:|---:|---|"]
            for k, e, fk in rows:
                f = e["figures"][fk]
                lines.append(f"| {_row_label(k, e, fk)} | {_n(f['value'])} | "
                             f"{_n(f.get('calls_per_s'))} | {_n(f['server_cpu_s'], 1)} | "
                             f"{_n(f['client_cpu_s'], 1)} | {_busy(f)} | "
                             f"{_n(f.get('records_per_server_cpu_s'))} | {f.get('note', '')} |")
            for _k, e in missing:
                lines.append(f"| {e['label']} | – | – | – | – | – | – | {_why_missing(e)} |")
        elif kind == "latency":
            lines += ["| system | p50 ms | p99 ms | p99.9 ms | samples | server CPU s | "
                      "client CPU s |", "|---|---:|---:|---:|---:|---:|---:|"]
            for k, e, fk in rows:
                f = e["figures"][fk]
                lines.append(f"| {_row_label(k, e, fk)} | {_n(f['p50_ms'], 2)} | "
                             f"{_n(f['p99_ms'], 2)} | {_n(f['p999_ms'], 2)} | "
                             f"{_n(f['samples'])} | {_n(f['server_cpu_s'], 1)} | "
                             f"{_n(f['client_cpu_s'], 1)} |")
        elif kind == "memory":
            lines += ["| system | bytes per queue | records held | server RSS before, MB | "
                      "after, MB | note |", "|---|---:|---:|---:|---:|---|"]
            for k, e, fk in rows:
                f = e["figures"][fk]
                lines.append(f"| {_row_label(k, e, fk)} | {_n(f['value'])} | "
                             f"{_n(f.get('records'))} | "
                             f"{_n(f['rss_before_mb'], 1)} | {_n(f['rss_after_mb'], 1)} | "
                             f"{f.get('note', '')} |")
        else:
            lines += ["| system | first read, s | all queues ready, s | what restarted |",
                      "|---|---:|---:|---|"]
            for k, e, fk in rows:
                f = e["figures"][fk]
                lines.append(f"| {_row_label(k, e, fk)} | {_n(f.get('first_read_s'), 2)} | "
                             f"{_n(f.get('all_ready_s'), 2)} | {e['restart']}"
                             + (f"; {f['note']}" if f.get("note") else "") + " |")
        lines.append("")
    lines += _systems_as_run(systems, sz)
    v = report["machine"]
    lines.append("Versions: " + ", ".join(f"{k} {x}" for k, x in {**v["servers"],
                                                                 **v["clients"]}.items()) + ".")
    lines.append("")
    return "\n".join(lines)


# One chart per workload: (file, title, [(figure key, field, series label)], unit, log scale)
CHARTS = [
    ("enqueue.png", "Enqueue, 100-record batches, 16 producers",
     [("enqueue_few", "value", "10 queues"), ("enqueue_many", "value", "100,000 queues")],
     "records/s", False),
    ("small_writes.png", "One record to each of {many_queues:,} queues",
     [("small_one", "value", "one call each, 16 in flight"),
      ("small_batched", "value", "the client's batching")], "records/s", True),
    ("end_to_end.png", "End to end: a write, to a parked reader",
     [("e2e", "p50_ms", "p50"), ("e2e", "p99_ms", "p99"), ("e2e", "p999_ms", "p99.9")],
     "ms", True),
    ("work_queue.png", "Work queue: {work_records:,} records, {work_queues} queues, "
     "{workers} workers",
     [("work_10", "value", "10 per call"), ("work_100", "value", "100 per call"),
      ("work_worker", "value", "vqueues Worker")], "records/s", True),
    ("memory.png", "Server memory per queue ({many_queues:,} queues × 2 records)",
     [("memory", "value", "bytes per queue")], "bytes", False),
    ("restart.png", "Restart with {many_queues:,} queues × 2 records",
     [("restart", "first_read_s", "first read of an old record"),
      ("restart", "all_ready_s", "all queues ready")], "seconds", False),
]


def charts(report: dict[str, Any], folder: Path) -> list[str]:
    """Render one PNG per workload into `folder`; lines saying what was written."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return ["matplotlib is not installed (pip install matplotlib): no charts"]
    systems = [e for e in report["systems"].values() if e.get("figures")]
    out = []
    for name, title, series, unit, log in CHARTS:
        labels = [str(e["label"]) for e in systems]
        data = [[e["figures"].get(k, {}).get(field) for e in systems]
                for k, field, _ in series]
        data_present = [(s, d) for s, d in zip(series, data, strict=True)
                        if any(v for v in d)]
        if not data_present:
            continue
        fig, ax = plt.subplots(figsize=(9, 0.55 * len(labels) * len(data_present) + 1.6))
        height = 0.8 / len(data_present)
        for j, ((_, _, label), values) in enumerate(data_present):
            ys = [i + j * height for i in range(len(labels))]
            vals = [v or 0 for v in values]
            bars = ax.barh(ys, vals, height=height, label=label)
            for bar, v in zip(bars, values, strict=True):
                if v:
                    ax.annotate(f"{v:,.0f}" if v >= 100 else f"{v:,.2f}",
                                (bar.get_width(), bar.get_y() + bar.get_height() / 2),
                                xytext=(3, 0), textcoords="offset points", va="center",
                                fontsize=7)
        for i, e in enumerate(systems):
            if all(e["figures"].get(k, {}).get(field) is None for k, field, _ in series):
                ax.annotate("not measured (see the table)", (0, i), xytext=(3, 0),
                            textcoords="offset points", va="center", fontsize=7)
        ax.set_yticks([i + height * (len(data_present) - 1) / 2 for i in range(len(labels))])
        ax.set_yticklabels(labels, fontsize=8)
        ax.invert_yaxis()
        if log:
            ax.set_xscale("log")
        ax.set_xlabel(unit + (" (log scale)" if log else ""))
        when = f"{report['date']}, {report['machine']['cores']} cores"
        ax.set_title(f"{title.format(**report['sizes'])}\n{when}", fontsize=10)
        if len(data_present) > 1:
            ax.legend(fontsize=7, loc="lower right")
        ax.margins(x=0.15)
        fig.tight_layout()
        fig.savefig(folder / name, dpi=110)
        plt.close(fig)
        out.append(f"chart: {folder / name}")
    return out
