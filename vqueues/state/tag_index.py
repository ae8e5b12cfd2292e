"""A partition's tag index: queue -> tag -> the offsets of its records that carry the tag
(ascending), so a filtered read or lease never scans a queue (ADR 9). Built from the records'
`vq-tags` headers as they are indexed; a snapshot carries the part below its cut."""

from __future__ import annotations

from array import array
from bisect import bisect_left
from collections.abc import Iterable, Iterator, Sequence


class TagIndex(dict[str, dict[str, "array[int]"]]):
    """queue -> tag -> offsets (ascending). A plain dict underneath: most partitions hold no
    tag, and an empty dict costs nothing more."""

    __slots__ = ()

    def add(self, queue: str, offset: int, tags: Iterable[str]) -> None:
        """Index the record at `offset` (the highest so far in `queue`) under each tag."""
        by_tag = self.get(queue)
        if by_tag is None:
            by_tag = self[queue] = {}
        for tag in tags:
            offsets = by_tag.get(tag)
            if offsets is None:
                offsets = by_tag[tag] = array("q")
            offsets.append(offset)

    def select(self, queue: str, tag: str, start: int, limit: int) -> list[int]:
        """Up to `limit` offsets of `queue`'s records carrying `tag`, at or after `start`."""
        offsets = self.get(queue, {}).get(tag)
        if offsets is None:
            return []
        i = bisect_left(offsets, start)
        return offsets[i:i + limit].tolist()

    def trim(self, queue: str, before: int) -> None:
        """Forget `queue`'s offsets below `before` (retention, a deletion)."""
        by_tag = self.get(queue)
        if by_tag is None:
            return
        for tag in list(by_tag):
            offsets = by_tag[tag]
            cut = bisect_left(offsets, before)
            if cut:
                del offsets[:cut]
            if not offsets:
                del by_tag[tag]
        if not by_tag:
            del self[queue]

    def drain(self, step: int) -> Iterator[None]:
        """Forget every queue, `step` of them between yields (a node lets go of a partition)."""
        while self:
            for _ in range(min(len(self), step)):
                self.popitem()
            yield

    # The snapshot's section ----------------------------------------------------------------

    def capture(self, cut: int) -> list[tuple[str, str, bytes]]:
        """(queue, tag, offsets below `cut` as raw int64) of every tag."""
        return [(q, tag, offsets[:bisect_left(offsets, cut)].tobytes())
                for q, by_tag in self.items() for tag, offsets in by_tag.items()]

    @classmethod
    def restore(cls, rows: Sequence[tuple[str, str, bytes]]) -> TagIndex:
        """The index `capture` described."""
        index = cls()
        for q, tag, raw in rows:
            offsets = array("q")
            offsets.frombytes(raw)
            index.setdefault(q, {})[tag] = offsets
        return index
