"""The cluster map: which node owns which partition, as the assignment topic says.

Assignment topic (one partition, compacted), keyed by the partition number so compaction keeps
one record per partition:
  b"7" -> {"v": 1, "state": "owned", "node": id, "url": url, "generation": g, "ts": ms}
  b"7" -> {"v": 1, "state": "released", "node": id, "generation": g, "ts": ms}
A node writes "owned" when the group assigns it a partition, with a generation one above the
highest it has seen, and "released" when it gives the partition up. A release only counts if it
comes from the current owner; a node that died without releasing is overwritten by the next.
A later layout's claims (ADR 19) are keyed `l<layout>/<partition>` (b"l1/7"); the map of a
layout reads only its own, and the layouts' own records (`layout/<n>`) too.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from vqueues.layouts import Cut, Layout, decode_cut, decode_layout


@dataclass(frozen=True, slots=True)
class Owner:
    node: str
    url: str
    generation: int


def claim_key(partition: int, layout: int = 0) -> bytes:
    return f"l{layout}/{partition}".encode() if layout else str(partition).encode()


def encode_claim(partition: int, node: str, url: str, generation: int, layout: int = 0
                 ) -> tuple[bytes, bytes]:
    return claim_key(partition, layout), json.dumps({
        "v": 1, "state": "owned", "node": node, "url": url, "generation": generation,
        "ts": int(time.time() * 1000)}, separators=(",", ":")).encode()


def encode_release(partition: int, node: str, generation: int, layout: int = 0
                   ) -> tuple[bytes, bytes]:
    return claim_key(partition, layout), json.dumps({
        "v": 1, "state": "released", "node": node, "generation": generation,
        "ts": int(time.time() * 1000)}, separators=(",", ":")).encode()


class ClusterMap:
    """Applied on the event loop from the assignment topic's tail."""

    def __init__(self, partitions: int, layout: int = 0) -> None:
        self.partitions = partitions
        self.layout = layout
        self.layouts: dict[int, Layout] = {layout: Layout(layout, partitions)}
        self.owners: dict[int, Owner] = {}
        # Per layout entered, the first cut of each partition of the layout before it.
        self.cuts: dict[int, dict[int, Cut]] = {}
        self.generation = 0
        self._prefix = f"l{layout}/".encode() if layout else b""

    def apply(self, records: Sequence[tuple[bytes | None, bytes | None]]) -> None:
        prefix = self._prefix
        for key, value in records:
            announced = decode_layout(key, value)
            if announced is not None:
                self.layouts[announced.number] = announced
                continue
            cut = decode_cut(key, value)
            if cut is not None:
                self.cuts.setdefault(cut.layout, {}).setdefault(cut.partition, cut)
                continue
            if prefix:
                if not key or not key.startswith(prefix):
                    continue
                key = key[len(prefix):]
            elif key and key[:1] == b"l":
                continue
            try:
                p = int(key or b"")
                body: dict[str, Any] = json.loads(value or b"null") or {}
                generation = int(body.get("generation", 0))
            except (ValueError, TypeError, AttributeError):
                continue
            if not 0 <= p < self.partitions:
                continue
            self.generation = max(self.generation, generation)
            state = body.get("state")
            if state == "owned":
                self.owners[p] = Owner(str(body.get("node")), str(body.get("url")), generation)
            elif state == "released":
                current = self.owners.get(p)
                if current is not None and current.node == body.get("node"):
                    del self.owners[p]

    def all_cut(self, layout: int) -> bool:
        """Whether every partition of the layout before `layout` is cut for it."""
        before = self.layouts.get(layout - 1)
        return before is not None and before.partitions > 0 and \
            len(self.cuts.get(layout, {})) >= before.partitions

    def owner(self, partition: int) -> Owner | None:
        return self.owners.get(partition)
