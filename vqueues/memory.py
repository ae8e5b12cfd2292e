"""The C allocator: fewer glibc malloc arenas, and freed memory handed back after a replay.

glibc gives each thread that allocates its own arena (up to 8 per core) and keeps freed memory
in them, so after a replay resident memory stays well above live (ADR 15). Capping the
arenas (`mallopt(M_ARENA_MAX)`, what the MALLOC_ARENA_MAX variable does, but settable once the
process runs) and calling `malloc_trim` after a replay keep resident close to live. Both are
glibc-only and do nothing elsewhere. A different allocator (jemalloc) would need LD_PRELOAD and
a system package; this needs neither.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import gc
import logging
import time
from collections.abc import Iterator
from typing import Any

log = logging.getLogger(__name__)

_M_ARENA_MAX = -8  # glibc's malloc.h
_libc: ctypes.CDLL | None = None


def _glibc() -> ctypes.CDLL | None:
    global _libc
    if _libc is None:
        name = ctypes.util.find_library("c")
        try:
            lib = ctypes.CDLL(name or "libc.so.6")
            lib.mallopt  # noqa: B018  (present on glibc only)
            lib.malloc_trim  # noqa: B018
        except (OSError, AttributeError):
            return None
        _libc = lib
    return _libc


def limit_arenas(arenas: int) -> bool:
    """Cap glibc's malloc arenas (0: leave glibc's default); call before threads start."""
    lib = _glibc()
    if lib is None or arenas <= 0:
        return False
    ok = bool(lib.mallopt(_M_ARENA_MAX, arenas))
    log.debug("malloc_arenas_limited", extra={"arenas": arenas, "ok": ok})
    return ok


def release_free_memory() -> bool:
    """Return the allocator's free pages to the system (blocking: run it off the loop)."""
    lib = _glibc()
    return bool(lib.malloc_trim(0)) if lib is not None else False


@contextlib.contextmanager
def long_lived() -> Iterator[None]:
    """Keep what the block builds (an index: many objects, no cycles) out of the collector's
    scans: no collection runs during it (each would scan the new queues again), and
    everything tracked is frozen after it (else the next full collection scans them all;
    ADR 15). Like every freeze without a
    collection, it also keeps whatever cyclic garbage was pending then (bounded by the block's
    length). Nested and concurrent blocks leave the collector on if it was on."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()  # O(1): the generations' lists are moved, not walked
        if collecting:
            gc.enable()


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]


def heap_in_use() -> int:
    """Bytes the C allocator has handed out and not had back (glibc's mallinfo2: `uordblks`
    plus memory-mapped blocks): the process's live memory, without what malloc merely keeps."""
    lib = _glibc()
    if lib is None or not hasattr(lib, "mallinfo2"):
        return 0
    lib.mallinfo2.restype = _MallInfo2
    info = lib.mallinfo2()
    return int(info.uordblks + info.hblkhd)


class Freezer:
    """Freezes long-lived objects out of the collector's scans once `limit` more of them are
    tracked than the fewest seen since the last freeze. A node's index grows among the tracked
    objects as queues are created after its start (a replay's is frozen as it is built), and
    the collections would scan them again and again (ADR 7). Requests in flight are tracked
    too but come and go: counted from that floor, many long polls do not set off a freeze (a
    collection of them all) at every check.
    Frozen objects are still freed by reference counting; only a cycle among them that dies
    later stays (the index holds no cycles; requests in flight at that moment may)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._floor: int | None = 0

    def check(self) -> int:
        """Collect once (it frees the garbage among them) and freeze the survivors if the tracked
        objects outside the frozen ones grew by `limit` over the floor; how many objects were
        tracked then (0: nothing done). About 1 ms per 100,000 tracked objects. A limit of 0
        never freezes."""
        if self.limit <= 0:
            return 0
        held = len(gc.get_objects())
        floor = held if self._floor is None else min(self._floor, held)
        if held - floor < self.limit:
            self._floor = floor
            return 0
        gc.collect()
        gc.freeze()
        self._floor = None  # the next check's count: the requests in flight by then
        return held


class GcPauses:
    """Logs every garbage collection that takes longer than `threshold_ms` (a stalled loop)."""

    def __init__(self, threshold_ms: float = 50.0) -> None:
        self.threshold_s = threshold_ms / 1000
        self._started = 0.0
        self._cpu_started = 0.0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            self._cpu_started = time.thread_time()
        elif (took := time.perf_counter() - self._started) > self.threshold_s:
            # cpu_ms: the collection's own work; the rest of ms the thread waited for a core.
            log.warning("gc_pause", extra={
                "generation": info.get("generation"), "ms": round(took * 1000),
                "cpu_ms": round((time.thread_time() - self._cpu_started) * 1000),
                "collected": info.get("collected")})

    def install(self) -> None:
        """Watch the collections (replacing a watcher installed before: a node restarted in
        its process on a new layout installs its own)."""
        gc.callbacks[:] = [c for c in gc.callbacks if not isinstance(c, GcPauses)]
        gc.callbacks.append(self)
