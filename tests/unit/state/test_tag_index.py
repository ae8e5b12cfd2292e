"""The tag index: queue -> tag -> offsets, trimmed with its queue, and its snapshot section."""

from vqueues.state.tag_index import TagIndex


def index_of(rows):
    index = TagIndex()
    for queue, offset, tags in rows:
        index.add(queue, offset, tags)
    return index


def test_a_tagged_record_is_found_under_each_of_its_tags_from_a_start():
    index = index_of([("q", 1, ["a", "b"]), ("q", 4, ["a"]), ("r", 5, ["a"]), ("q", 9, ["b"])])
    assert index.select("q", "a", 0, 10) == [1, 4]
    assert index.select("q", "b", 2, 10) == [9]
    assert index.select("q", "a", 0, 1) == [1]
    assert index.select("q", "c", 0, 10) == [] and index.select("nobody", "a", 0, 10) == []


def test_trimming_a_queue_drops_its_offsets_below_and_then_its_empty_tags():
    index = index_of([("q", 1, ["a", "b"]), ("q", 4, ["a"]), ("r", 5, ["a"])])
    index.trim("q", 2)
    assert index.select("q", "a", 0, 10) == [4] and "b" not in index["q"]
    index.trim("q", 5)
    assert "q" not in index and index.select("r", "a", 0, 10) == [5]
    index.trim("nobody", 10)  # nothing to do


def test_its_snapshot_section_keeps_what_lies_below_the_cut():
    index = index_of([("q", 1, ["a"]), ("q", 7, ["a", "b"]), ("r", 3, ["c"])])
    rows = index.capture(5)
    assert sorted((q, t) for q, t, _ in rows) == [("q", "a"), ("q", "b"), ("r", "c")]
    restored = TagIndex.restore(rows)
    assert restored.select("q", "a", 0, 10) == [1]
    assert restored.select("q", "b", 0, 10) == [] and restored.select("r", "c", 0, 10) == [3]
    assert TagIndex.restore(index.capture(100)) == index


def test_draining_forgets_every_queue_a_step_at_a_time():
    index = index_of([(f"q{i}", i, ["t"]) for i in range(10)])
    steps = list(index.drain(4))
    assert len(steps) == 3 and index == {}
