"""The web console in a real headless Chromium (Debian's package, driven by Playwright) against
two real nodes with auth on: the token entered once, the cluster map, the searchable queue list,
a queue page with consumers and the latest records, live refresh, and delete with confirmation.
Screenshots go to test-artifacts/console/."""

import contextlib
import json
import os
import shutil
import time
import uuid
from pathlib import Path

import pytest
from vqueues_client import Client, VQError

from tests.support import NodeProcess, queues_in_partition, wait_settled
from vqueues.api.auth import token_hash

CHROMIUM = os.environ.get("VQ_TEST_CHROMIUM") or shutil.which("chromium") or \
    shutil.which("chromium-browser")
ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts" / "console"
TOKEN = "console-" + uuid.uuid4().hex
# The flags this machine's closed network needs (no background connections to Google).
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--disable-dev-shm-usage"]

pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="no Chromium here: install Debian's `chromium` package "
    "(.ci/run does where apt-get can), or set VQ_TEST_CHROMIUM to a Chromium binary")


@pytest.fixture(scope="module")
def nodes(topics, tmp_path_factory):
    tokens = tmp_path_factory.mktemp("console") / "tokens.json"
    tokens.write_text(json.dumps({"tokens": [
        {"name": "ops", "sha256": token_hash(TOKEN),
         "scopes": {"admin": [""], "read": [""], "write": [""]}}]}))
    env = {"VQ_AUTH": "true", "VQ_AUTH_TOKEN_FILE": str(tokens)}
    started = [NodeProcess(topics, node_id=f"console-{i}", extra_env=env) for i in range(2)]
    try:
        for n in started:
            n.start(wait_ready=False)
        wait_settled(started, topics.partitions)
        yield started
    finally:
        for n in started:
            n.terminate()


@pytest.fixture(scope="module")
def queues(nodes, topics):
    """Queues owned by each node, with a cursor consumer behind and a lease consumer holding
    one record."""
    run = uuid.uuid4().hex[:6]
    owners = wait_settled(nodes, topics.partitions)
    by_node = {n.url: next(p for p, u in owners.items() if u == n.url) for n in nodes}
    names = [queues_in_partition(by_node[n.url], topics.partitions, 1,
                                 prefix=f"shop-{run}/orders-{i}")[0]
             for i, n in enumerate(nodes)]
    with Client(nodes[0].url, token=TOKEN) as vq:
        for i, name in enumerate(names):
            vq.enqueue(name, [f"order {i}-{k}" for k in range(12)])
        vq.ack(names[0], "billing", 0)
        vq.configure_consumer(names[1], "workers", mode="lease")
        assert len(vq.lease(names[1], "workers", max_records=1)) == 1
        vq.enqueue(f"other-{run}", ["x"])
    return run, names


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture(scope="module")
def page(browser, nodes, queues):
    """One page of the console on node 0: the token is entered once, here."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    pg = context.new_page()
    pg.set_default_timeout(15000)
    pg.goto(f"{nodes[0].url}/ui")
    pg.get_by_placeholder("token").wait_for()  # the node answered 401: the console asks
    pg.screenshot(path=str(ARTIFACTS / "0-token.png"))
    pg.get_by_placeholder("token").fill(TOKEN)
    pg.get_by_role("button", name="Save token").click()
    yield pg
    context.close()


def test_the_cluster_page_shows_nodes_partitions_owners_and_readiness(page, nodes, topics):
    page.goto(f"{nodes[0].url}/ui/#/cluster")
    page.get_by_test_id("partitions").locator("tbody tr").nth(topics.partitions - 1).wait_for()
    assert page.get_by_test_id("partition-count").inner_text() == str(topics.partitions)
    assert page.get_by_test_id("node-count").inner_text() == "2"
    node_rows = page.get_by_test_id("nodes").locator("tbody tr")
    assert sorted(r.split("\t")[0] for r in node_rows.all_inner_texts()) == [
        "console-0", "console-1"]
    assert all("ready" in r for r in node_rows.all_inner_texts())
    rows = page.get_by_test_id("partitions").locator("tbody tr").all_inner_texts()
    assert len(rows) == topics.partitions
    owners = {r.split("\t")[1] for r in rows}
    assert owners == {"console-0", "console-1"}  # each partition's owner, from both nodes
    assert all(r.split("\t")[2] == "yes" and r.split("\t")[5] == "done" for r in rows)
    page.screenshot(path=str(ARTIFACTS / "1-cluster.png"), full_page=True)
    assert page.get_by_placeholder("token").is_hidden()  # entered once, not asked again


def test_the_queue_list_is_searchable_with_depth_and_worst_lag(page, nodes, queues):
    run, names = queues
    page.goto(f"{nodes[0].url}/ui/#/queues")
    page.get_by_role("link", name=names[0]).wait_for()
    page.get_by_role("link", name=names[1]).wait_for()  # owned by the other node
    page.get_by_role("searchbox").fill(f"shop-{run}")
    page.get_by_test_id("queue-count").filter(has_text="2 of").wait_for()
    rows = page.get_by_test_id("queues").locator("tbody tr").all_inner_texts()
    cells = {r.split("\t")[0]: r.split("\t") for r in rows}
    assert set(cells) == set(names)
    assert cells[names[0]][2:] == ["12", "1", "12"]  # records, consumers, worst lag
    assert cells[names[1]][2:] == ["12", "1", "12"]
    page.screenshot(path=str(ARTIFACTS / "2-queues.png"), full_page=True)


def test_a_queue_page_shows_offsets_consumers_and_the_latest_records(page, nodes, queues):
    _, names = queues
    page.goto(f"{nodes[0].url}/ui/#/queues")
    page.get_by_role("searchbox").fill(names[1])
    page.get_by_role("link", name=names[1]).click()  # a queue the other node owns
    page.get_by_test_id("consumers").wait_for()
    assert page.get_by_test_id("queue-name").inner_text() == names[1]
    assert page.get_by_test_id("records").inner_text() == "12"
    consumer = page.get_by_test_id("consumers").locator("tbody tr").first.inner_text()
    name, mode, offset, lag, in_flight = consumer.split("\t")[:5]
    assert (name, mode, offset, lag, in_flight) == ("workers", "lease", "0", "12", "1")
    latest = page.get_by_test_id("latest").locator("tbody tr").all_inner_texts()
    assert len(latest) == 10
    values = [row.split("\t")[2].strip() for row in latest]
    assert values == [f"order 1-{k}" for k in range(11, 1, -1)]  # newest first
    page.screenshot(path=str(ARTIFACTS / "3-queue.png"), full_page=True)


def test_the_queue_page_refreshes_live(page, nodes, queues):
    _, names = queues
    page.goto(f"{nodes[0].url}/ui/#/queue/{names[0].replace('/', '%2F')}")
    page.get_by_test_id("records").filter(has_text="12").wait_for()
    with Client(nodes[1].url, token=TOKEN) as vq:
        vq.enqueue(names[0], ["fresh"])
    page.get_by_test_id("records").filter(has_text="13").wait_for(timeout=10000)
    page.get_by_test_id("latest").get_by_text("fresh").wait_for()


def test_delete_asks_for_confirmation(page, nodes, queues):
    run, _ = queues
    victim = f"other-{run}"
    page.goto(f"{nodes[0].url}/ui/#/queue/{victim}")
    page.get_by_test_id("delete").click()
    dialog = page.locator("dialog#confirm")
    dialog.wait_for()
    assert victim in dialog.inner_text()
    page.screenshot(path=str(ARTIFACTS / "4-confirm.png"))
    page.get_by_role("button", name="Cancel").click()
    time.sleep(0.5)
    with Client(nodes[0].url, token=TOKEN) as vq:
        assert vq.queue_info(victim) is not None  # cancelled: still there
        page.get_by_test_id("delete").click()
        page.locator("dialog#confirm").get_by_role("button", name="Delete").click()
        page.get_by_test_id("deleted").wait_for()
        assert vq.queue_info(victim) is None
    page.screenshot(path=str(ARTIFACTS / "5-deleted.png"))


def test_the_workers_page_shows_prefix_consumers_summed_over_the_nodes(page, nodes, queues):
    run, names = queues
    with Client(nodes[0].url, token=TOKEN) as vq:
        records = sum(vq.queue_info(n)["records"] for n in names)  # type: ignore[index]
        vq.configure_prefix_consumer("pool", f"shop-{run}/", max_in_flight=5)
        for n in nodes:  # a lease from each node, once it learnt of the prefix consumer
            for _ in range(50):
                with contextlib.suppress(VQError):  # 404 until the node's tail brings it
                    if vq.lease_prefix("pool", n.url, max_records=1):
                        break
                time.sleep(0.1)
    page.goto(f"{nodes[0].url}/ui/#/workers")
    page.get_by_test_id("workers").locator("tbody tr").filter(has_text="pool").wait_for()
    row = page.get_by_test_id("workers").locator("tbody tr").filter(
        has_text="pool").inner_text().split("\t")
    # consumer, prefix, queues, waiting, backlog, in flight, max in flight, attempts
    assert row[:3] == ["pool", f"shop-{run}/", "2"]
    assert row[4:7] == [str(records), "2", "5"]  # nothing completed: every record
    page.screenshot(path=str(ARTIFACTS / "6-workers.png"), full_page=True)
