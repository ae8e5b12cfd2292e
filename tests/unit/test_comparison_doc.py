"""docs/comparison.md shows the figures scripts/bench_peers.py printed: every table in it is the
one the script renders from the run's docs/comparison/results.json, and every chart it links
was rendered and checked in."""

import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

from peers.report import tables  # noqa: E402

DOC = ROOT / "docs" / "comparison.md"
RUN = ROOT / "docs" / "comparison"


def blocks(markdown: str) -> list[str]:
    """Each '### ' section's table: its heading and rows."""
    out = []
    for part in markdown.split("\n### ")[1:]:
        heading, _, rest = part.partition("\n\n")
        rows = rest.split("\n\n")[0]
        out.append(f"### {heading}\n\n{rows}")
    return out


def test_every_table_in_the_doc_is_the_scripts_own():
    report = json.loads((RUN / "results.json").read_text())
    rendered = tables(report)
    assert rendered == (RUN / "tables.md").read_text()
    doc = DOC.read_text()
    figures = [b for b in blocks(rendered) if b.startswith("### ") and "| system |" in b]
    assert len(figures) >= 9
    for block in figures:
        assert block in doc, block.splitlines()[0]
    assert report["date"] in doc


def test_the_doc_links_a_chart_per_workload_and_the_readme_links_the_doc():
    doc = DOC.read_text()
    charts = re.findall(r"\(comparison/([a-z_]+\.png)\)", doc)
    assert sorted(charts) == sorted(["enqueue.png", "small_writes.png", "end_to_end.png",
                                     "work_queue.png", "memory.png", "restart.png"])
    for name in charts:
        assert (RUN / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
    assert "docs/comparison.md" in (ROOT / "README.md").read_text()
