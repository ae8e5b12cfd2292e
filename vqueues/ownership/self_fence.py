"""The self-fence: a node that may have stood still refuses to act on its partitions until the
group confirms it still owns them (docs/cluster.md, "A paused node").

While a node stands still (SIGSTOP, a frozen VM, a machine that stalls) its group session can
expire and another node take its partitions over; the new owner's replay then ignores what the
old one writes after the takeover. So the old node must not answer 200 for such a write. A
thread ticks every TICK_S: a gap between two ticks longer than `bound_s` (shorter than the
session timeout) is a pause. From then on, and also whenever the last tick is older than the
bound (after a resume the event loop can run before the ticker does), `check` refuses with a
retriable 503 until the group thread has confirmed this member's generation with the group
coordinator (`confirmed`). A write notes the `epoch` when it starts; if a pause began before
it was acknowledged, `check_since` refuses its answer: its outcome is unknown, never 200.

The clock is `time.monotonic`, which counts the time a process stood still (CLOCK_MONOTONIC).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from vqueues.errors import Unavailable

log = logging.getLogger(__name__)

TICK_S = 0.1


class SelfFence:
    """Pause detection and the refusal that follows it, until the group confirms."""

    def __init__(self, bound_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.bound_s = bound_s
        self._clock = clock
        self._last_tick = clock()
        self.epoch = 0  # grows with each pause seen
        self.suspect = False  # a pause was seen and the group has not confirmed since
        self.pauses = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> SelfFence:
        self._thread = threading.Thread(target=self._run, name="vq-self-fence", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(1.0)

    def _run(self) -> None:
        while not self._stop.wait(TICK_S):
            self.tick()

    def tick(self) -> None:
        now = self._clock()
        gap = now - self._last_tick
        if gap > self.bound_s:
            self.epoch += 1
            self.suspect = True
            self.pauses += 1
            log.warning("pause_detected", extra={"gap_ms": round(gap * 1000),
                                                 "bound_ms": round(self.bound_s * 1000)})
        self._last_tick = now

    def stale(self) -> bool:
        """Whether this node may have stood still since it last knew it owned its partitions."""
        return self.suspect or self._clock() - self._last_tick > self.bound_s

    def confirmed(self, epoch: int) -> None:
        """The group coordinator accepted this member's generation after pause `epoch`."""
        if epoch == self.epoch and self.suspect:
            self.suspect = False
            log.info("ownership_confirmed", extra={"epoch": epoch})

    def check(self, partition: int | None = None) -> None:
        """503 while the node may have stood still without confirming its ownership since."""
        if self.stale():
            raise Unavailable("partition_unavailable", f"this node stood still for over "
                              f"{round(self.bound_s * 1000)} ms and has not yet confirmed that "
                              "it still owns its partitions; retry shortly", partition=partition)

    def check_since(self, epoch: int, partition: int | None = None) -> None:
        """503 if the node may have stood still since `epoch` was noted: a write made across
        a pause may be ignored by a new owner, so its outcome is unknown."""
        if epoch != self.epoch or self.stale():
            raise Unavailable("partition_unavailable", "this node stood still while the "
                              "request's write was in flight; whether it counts is unknown: "
                              "retry it", partition=partition)
