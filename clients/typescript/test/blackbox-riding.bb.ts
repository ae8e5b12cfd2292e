/** Black-box checks, written from the client's README and docs/work-queues.md only, of what they
 * promise about completions riding on leases (one round trip per cycle): `lease` with
 * `complete`, `leasePrefix` with `complete`, `configureConsumer`'s `durableGrants` and
 * `maxInFlight`, the Worker's riding completions and the stream's `completeWithCredit`.
 * Against the node at $VQ_TS_BB_URL (tests/test_typescript_blackbox_riding.py starts one), or
 * else a one-node `vqueues dev` started and stopped here. Calls are counted by the node's own
 * `vq_http_requests_total{route,method,status}` (docs/api.md). */
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import {
  BadRequestError, Client, type Lease, MAX_RIDING_TOKENS, type RefusedCompletion, Worker,
} from "../src/index.js";
import { DevCluster } from "./cluster.js";

const QUEUE_ROUTE = "/v1/queues/{queue}/consumers/{consumer}";
const run = Date.now().toString(36);

function sleep(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}

async function waitFor(what: string, cond: () => Promise<boolean>, ms = 20_000): Promise<void> {
  const deadline = Date.now() + ms;
  while (!(await cond())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await sleep(50);
  }
}

describe("completions riding on leases, as documented", () => {
  let cluster: DevCluster | undefined;
  let url: string;
  let vq: Client;

  before(async () => {
    if (process.env.VQ_TS_BB_URL) {
      url = process.env.VQ_TS_BB_URL;
    } else {
      cluster = await DevCluster.start(1, 4);
      url = cluster.urls[0];
    }
    vq = new Client([url]);
  });

  after(async () => {
    vq?.close();
    await cluster?.stop();
  });

  /** POSTs the node answered on `route` (summed over statuses), from its /metrics. */
  async function calls(route: string): Promise<number> {
    const text = await (await fetch(`${url}/metrics`)).text();
    let total = 0;
    for (const line of text.split("\n")) {
      if (!line.startsWith("vq_http_requests_total{")) continue;
      if (!line.includes(`route="${route}"`) || !line.includes('method="POST"')) continue;
      total += Number(line.slice(line.lastIndexOf(" ") + 1));
    }
    return total;
  }

  /** The consumer's mark is past the queue's last record: every record is done. */
  async function allDone(q: string, consumer: string): Promise<boolean> {
    const info = await vq.queueInfo(q);
    const c = info?.consumers.find((x) => x.consumer === consumer);
    return c !== undefined && info!.last_offset !== null && c.offset === info!.last_offset + 1;
  }

  async function consumerState(q: string, consumer: string) {
    const info = await vq.queueInfo(q);
    const c = info?.consumers.find((x) => x.consumer === consumer);
    assert.ok(c, `consumer ${consumer} on ${q}`);
    return c;
  }

  test("lease's complete: completed and refused token by token, empty without tokens", async () => {
    const q = `bb-ride-${run}`;
    await vq.configureConsumer(q, "pool", { mode: "lease" });
    await vq.enqueue(q, ["a", "b", "c", "d", "e"]);
    const first = await vq.lease(q, "pool", { maxRecords: 3 });
    assert.deepEqual(first.map((l) => l.text), ["a", "b", "c"]);
    assert.deepEqual(first.completed, []);
    assert.deepEqual(first.refused, []);
    // Not enumerable: the batch compares, spreads and prints as the records alone.
    assert.deepEqual(Object.keys(first), ["0", "1", "2"]);
    assert.equal([...first].length, 3);
    assert.equal(JSON.stringify(first), JSON.stringify([...first]));

    // Leases and token strings, mixed; a string that is no token is refused alone.
    const second = await vq.lease(q, "pool", {
      maxRecords: 2, complete: [first[0], first[1].token, "not-a-token"] });
    assert.deepEqual(second.map((l) => l.text), ["d", "e"]);
    assert.deepEqual([...second.completed].sort(), [first[0].token, first[1].token].sort());
    assert.deepEqual(second.refused, [{ token: "not-a-token", code: "invalid_token" }]);
    assert.equal((await consumerState(q, "pool")).in_flight, 3);

    // Done already: completed again (safe to send again); a repeat counts once.
    const third = await vq.lease(q, "pool", {
      complete: [first[0].token, first[2], first[2], ...second] });
    assert.equal(third.length, 0);
    assert.deepEqual([...third.completed].sort(),
                     [first[0].token, first[2].token, second[0].token, second[1].token].sort());
    assert.deepEqual(third.refused, []);
    const state = await consumerState(q, "pool");
    assert.equal(state.in_flight, 0);
    assert.ok(await allDone(q, "pool"), "every record is done: the mark is past them");
    const empty = await vq.lease(q, "pool", { maxRecords: 5, waitMs: 200 });
    assert.equal(empty.length, 0, "a completed record is never delivered again");
  });

  test("a token whose record was leased again since is refused lease_expired", async () => {
    const q = `bb-expired-${run}`;
    await vq.configureConsumer(q, "pool", { mode: "lease" });
    await vq.enqueue(q, "x");
    const [old] = await vq.lease(q, "pool", { visibilityMs: 100 });
    await sleep(400);
    const again = await vq.lease(q, "pool", { waitMs: 5_000 });
    assert.equal(again.length, 1);
    assert.equal(again[0].offset, old.offset);
    assert.equal(again[0].attempt, 2);
    const ride = await vq.lease(q, "pool", { complete: [old, again[0]] });
    assert.deepEqual(ride.completed, [again[0].token]);
    assert.deepEqual(ride.refused, [{ token: old.token, code: "lease_expired" }]);
    // An expired lease whose record nobody leased since still completes (the work was done).
    await vq.enqueue(q, "y");
    const [late] = await vq.lease(q, "pool", { visibilityMs: 100 });
    await sleep(400);
    const done = await vq.lease(q, "pool", { complete: [late] });
    assert.deepEqual(done.completed, [late.token]);
    assert.equal(done.length, 0, "completed first, so the lease finds nothing left");
  });

  test("configureConsumer's durableGrants and maxInFlight read back; riding frees room", async () => {
    const q = `bb-settings-${run}`;
    const set = await vq.configureConsumer(q, "pool",
                                           { mode: "lease", durableGrants: true, maxInFlight: 1 });
    assert.equal(set.durable_grants, true);
    assert.equal(set.max_in_flight, 1);
    const read = await vq.consumerSettings(q, "pool");
    assert.equal(read!.durable_grants, true);
    assert.equal(read!.max_in_flight, 1);
    assert.equal(read!.mode, "lease");
    // Fields left out keep their value.
    const partial = await vq.configureConsumer(q, "pool", { maxAttempts: 3 });
    assert.equal(partial.durable_grants, true);
    assert.equal(partial.max_in_flight, 1);
    assert.equal(partial.max_attempts, 3);

    await vq.enqueue(q, ["r0", "r1", "r2"]);
    const one = await vq.lease(q, "pool", { maxRecords: 3 });
    assert.deepEqual(one.map((l) => l.text), ["r0"], "max_in_flight 1 caps the lease");
    // Completed first: the in-flight room it frees counts for the same lease.
    const next = await vq.lease(q, "pool", { maxRecords: 3, complete: one });
    assert.deepEqual(next.completed, [one[0].token]);
    assert.deepEqual(next.map((l) => l.text), ["r1"]);

    const cleared = await vq.configureConsumer(q, "pool",
                                               { durableGrants: false, maxInFlight: null });
    assert.equal(cleared.durable_grants, false);
    assert.equal(cleared.max_in_flight, null);
    const back = await vq.consumerSettings(q, "pool");
    assert.equal(back!.durable_grants, false);
    assert.equal(back!.max_in_flight, null);
    const rest = await vq.lease(q, "pool", { maxRecords: 3, complete: next });
    assert.deepEqual(rest.map((l) => l.text), ["r2"]);
  });

  test("MAX_RIDING_TOKENS: 10,000 ride; one more is limit_out_of_range and nothing is done",
       async () => {
    assert.equal(MAX_RIDING_TOKENS, 10_000);
    const q = `bb-limit-${run}`;
    await vq.configureConsumer(q, "pool", { mode: "lease" });
    await vq.enqueue(q, ["m0", "m1"]);
    const leased = await vq.lease(q, "pool", { maxRecords: 2 });
    assert.equal(leased.length, 2);
    const junk = (n: number) => Array.from({ length: n }, (_, i) => `junk-${i}`);

    const over = [leased[0].token, ...junk(MAX_RIDING_TOKENS)];
    await assert.rejects(vq.lease(q, "pool", { complete: over }), (e: BadRequestError) => {
      assert.ok(e instanceof BadRequestError, String(e));
      assert.equal(e.status, 400);
      assert.equal(e.code, "limit_out_of_range");
      assert.equal(e.retriable, false);
      assert.equal((e.details as Record<string, unknown>).parameter, "complete");
      return true;
    });
    assert.equal((await consumerState(q, "pool")).in_flight, 2, "nothing was completed");

    const atLimit = [leased[0].token, ...junk(MAX_RIDING_TOKENS - 1)];
    const ride = await vq.lease(q, "pool", { complete: atLimit });
    assert.deepEqual(ride.completed, [leased[0].token]);
    assert.equal(ride.refused.length, MAX_RIDING_TOKENS - 1);
    assert.ok(ride.refused.every((r) => r.code === "invalid_token"));
    assert.equal((await consumerState(q, "pool")).in_flight, 1);
    await vq.complete(q, "pool", leased[1]);
  });

  test("leasePrefix's complete answers { queue, token } pairs", async () => {
    const prefix = `bbpre-${run}-`;
    const consumer = `bbpool-${run}`;
    await vq.configurePrefixConsumer(consumer, prefix, {});
    const qa = `${prefix}a`;
    const qb = `${prefix}b`;
    await vq.enqueue(qa, ["a0", "a1"]);
    await vq.enqueue(qb, ["b0"]);
    const [node] = await vq.nodeUrls();
    let leases: Lease[] = [];
    await waitFor("the prefix consumer's records", async () => {
      const got = await vq.leasePrefix(consumer, node, { maxRecords: 10, waitMs: 500 });
      leases = leases.concat(got);
      return leases.length >= 3;
    });
    assert.deepEqual(leases.map((l) => l.text).sort(), ["a0", "a1", "b0"]);
    const junk = { queue: qa, token: "not-a-token" };
    const ride = await vq.leasePrefix(consumer, node, { complete: [...leases, junk] });
    assert.equal(ride.length, 0);
    const pairs = (xs: Array<{ queue: string; token: string }>) =>
      xs.map((x) => `${x.queue} ${x.token}`).sort();
    assert.deepEqual(pairs(ride.completed), pairs(leases.map((l) => ({ queue: l.queue!,
                                                                       token: l.token }))));
    assert.deepEqual(ride.refused, [{ queue: qa, token: "not-a-token", code: "invalid_token" }]);
    for (const q of [qa, qb]) assert.equal((await consumerState(q, consumer)).in_flight, 0);
    // A queue not under the prefix: 400 invalid_parameter for the whole call.
    await assert.rejects(
      vq.leasePrefix(consumer, node, { complete: [{ queue: `other-${run}`, token: "1.1.x" }] }),
      (e: BadRequestError) => e instanceof BadRequestError && e.code === "invalid_parameter");
  });

  test("a busy Worker completes through its next lease: no standalone complete", async () => {
    const q = `bb-busy-${run}`;
    await vq.configureConsumer(q, "pool", { mode: "lease" });
    const n = 20;
    await vq.enqueue(q, Array.from({ length: n }, (_, i) => `w${i}`));
    const completes0 = await calls(`${QUEUE_ROUTE}/complete`);
    const leases0 = await calls(`${QUEUE_ROUTE}/lease`);
    const seen: string[] = [];
    // completeDelayMs far beyond the run: every token waits for a lease to carry it.
    const worker = new Worker(vq, q, "pool", async (lease) => {
      seen.push(lease.text!);
      await sleep(10);
    }, { concurrency: 1, completeDelayMs: 60_000, waitMs: 300 }).start();
    try {
      await waitFor("every record done", () => allDone(q, "pool"));
      assert.equal(await calls(`${QUEUE_ROUTE}/complete`), completes0,
                   "no standalone complete: the tokens rode on leases");
      const leaseCalls = (await calls(`${QUEUE_ROUTE}/lease`)) - leases0;
      assert.ok(leaseCalls <= n + 5, `one lease call per cycle at most (${leaseCalls} for ${n})`);
    } finally {
      await worker.stop();
    }
    assert.deepEqual([...seen].sort(), Array.from({ length: n }, (_, i) => `w${i}`).sort(),
                     "each record handled once");
    assert.equal(worker.completed, n);
    assert.equal((await consumerState(q, "pool")).in_flight, 0);
  });

  test("completeDelayMs: a token no lease carries goes in a standalone complete", async () => {
    const q = `bb-delay-${run}`;
    await vq.configureConsumer(q, "pool", { mode: "lease" });
    await vq.enqueue(q, "slow");
    const completes0 = await calls(`${QUEUE_ROUTE}/complete`);
    // Two slots: while the record's handler runs, the free slot's lease long-polls (10 s), so
    // the finished token has no lease to ride on for that long.
    const worker = new Worker(vq, q, "pool", async () => { await sleep(500); },
                              { concurrency: 2, prefetch: 0, waitMs: 10_000,
                                completeDelayMs: 50 }).start();
    try {
      await waitFor("the record done", () => allDone(q, "pool"), 8_000);
      assert.equal(await calls(`${QUEUE_ROUTE}/complete`), completes0 + 1);
      assert.equal(worker.completed, 1);
    } finally {
      await worker.stop();
    }
  });

  test("stop() completes what handlers finished while the tokens still waited", async () => {
    const q = `bb-stop-${run}`;
    await vq.configureConsumer(q, "pool", { mode: "lease" });
    await vq.enqueue(q, "held");
    let handled = false;
    const worker = new Worker(vq, q, "pool", async () => { await sleep(300); handled = true; },
                              { concurrency: 2, prefetch: 0, waitMs: 10_000,
                                completeDelayMs: 60_000 }).start();
    let stopped = false;
    try {
      await waitFor("the handler done", async () => handled);
      await sleep(700);
      const state = await consumerState(q, "pool");
      assert.equal(state.in_flight, 1, "the token waits (completeDelayMs, a long poll out)");
      assert.equal(worker.completed, 0);
      await worker.stop();
      stopped = true;
    } finally {
      if (!stopped) await worker.stop();
    }
    const state = await consumerState(q, "pool");
    assert.equal(state.in_flight, 0);
    assert.ok(await allDone(q, "pool"));
    assert.equal(worker.completed, 1);
  });

  /** A worker whose one record's lease is made stale by its handler: it gives the record back
   * and leases it again under a new token, so the worker's completion is refused. */
  async function staleRun(q: string, onRefused?: (r: RefusedCompletion) => void) {
    await vq.configureConsumer(q, "pool", { mode: "lease" });
    await vq.enqueue(q, ["stale", "fine"]);
    const stolen: Lease[] = [];
    const worker = new Worker(vq, q, "pool", async (lease) => {
      if (lease.text !== "stale") return;
      await vq.retry(q, "pool", lease, { delayMs: 0 });
      const again = await vq.lease(q, "pool", { waitMs: 5_000 });
      stolen.push(...again);
    }, { concurrency: 1, prefetch: 0, maxBatch: 1, waitMs: 300,
         ...(onRefused ? { onRefused } : {}) }).start();
    try {
      await waitFor("both records handled and settled", async () => {
        const s = await consumerState(q, "pool");
        return stolen.length === 1 && s.in_flight === 1 && s.available === 0;
      });
    } finally {
      await worker.stop();
    }
    assert.equal(stolen[0].text, "stale");
    await vq.complete(q, "pool", stolen);
    return { worker, stolen };
  }

  test("onRefused gets each refused completion: { lease, queue, token, code }", async () => {
    const q = `bb-refused-${run}`;
    const refused: RefusedCompletion[] = [];
    const { worker, stolen } = await staleRun(q, (r) => refused.push(r));
    assert.equal(refused.length, 1);
    assert.equal(refused[0].code, "lease_expired");
    assert.equal(refused[0].queue, q);
    assert.equal(refused[0].lease.text, "stale");
    assert.equal(refused[0].token, refused[0].lease.token);
    assert.notEqual(refused[0].token, stolen[0].token);
    assert.equal(worker.completed, 1, "only the completion the node answered counts");
  });

  test("without onRefused a refused completion is logged with console.warn", async () => {
    const q = `bb-warn-${run}`;
    const warned: unknown[][] = [];
    const warn = console.warn;
    console.warn = (...args: unknown[]) => { warned.push(args); };
    let worker: Worker;
    try {
      ({ worker } = await staleRun(q));
    } finally {
      console.warn = warn;
    }
    assert.equal(warned.length, 1, JSON.stringify(warned));
    assert.match(warned[0].map(String).join(" "), /lease_expired/);
    assert.equal(worker.completed, 1);
  });

  test("stream.completeWithCredit: on the next credit frame, or alone, token by token",
       async () => {
    const q = `bb-stream-${run}`;
    await vq.configureConsumer(q, "pool", { mode: "lease" });
    await vq.enqueue(q, ["s0", "s1", "s2", "s3"]);
    const stream = await vq.stream(q, "pool", { mode: "lease", credit: 1 });
    try {
      const it = stream[Symbol.asyncIterator]();
      const s0 = (await it.next()).value as Lease;
      assert.equal(s0.text, "s0");
      // Not awaited: the credit frame the next record taken grants carries it.
      const riding = stream.completeWithCredit(s0);
      const s1 = (await it.next()).value as Lease;
      assert.equal(s1.text, "s1");
      assert.deepEqual(await riding, { completed: [s0.token], refused: [] });

      // Awaited at once: no credit frame goes out, so it is completed alone after
      // completeDelayMs, still answered token by token.
      const alone = await stream.completeWithCredit([s1, "not-a-token"]);
      assert.deepEqual(alone.completed, [s1.token]);
      assert.deepEqual(alone.refused, [{ token: "not-a-token", code: "invalid_token" }]);
      // Done already: completed again.
      const s2 = (await it.next()).value as Lease;
      const twice = stream.completeWithCredit([s0, s2]);
      const s3 = (await it.next()).value as Lease;
      const r = await twice;
      assert.deepEqual([...r.completed].sort(), [s0.token, s2.token].sort());
      assert.deepEqual(r.refused, []);
      assert.equal(s3.text, "s3");

      // More waiting than a frame takes (MAX_RIDING_TOKENS): what is left goes after it.
      await vq.enqueue(q, ["s4", "s5"]);
      const s4 = (await it.next()).value as Lease;
      assert.equal(s4.text, "s4");
      const half = MAX_RIDING_TOKENS / 2;
      const first = stream.completeWithCredit(
        Array.from({ length: half }, (_, i) => `junk-a${i}`));
      const second = stream.completeWithCredit(
        [s3, ...Array.from({ length: half }, (_, i) => `junk-b${i}`)]);
      const s5 = (await it.next()).value as Lease;
      const [a, b] = await Promise.all([first, second]);
      assert.deepEqual(a.completed, []);
      assert.equal(a.refused.length, half);
      assert.deepEqual(b.completed, [s3.token]);
      assert.equal(b.refused.length, half);
      assert.ok([...a.refused, ...b.refused].every((x) => x.code === "invalid_token"));
      // One call takes at most MAX_RIDING_TOKENS: more reject with a RangeError, nothing sent.
      await assert.rejects(
        stream.completeWithCredit([s4, ...Array.from({ length: MAX_RIDING_TOKENS },
                                                      (_, i) => `junk-c${i}`)]),
        RangeError);
      assert.equal((await consumerState(q, "pool")).in_flight, 2, "s4 was not completed");

      // close() rejects the tokens still waiting, without sending them.
      const waiting = stream.completeWithCredit([s4, s5]);
      stream.close();
      await assert.rejects(waiting);
      await sleep(200);
      assert.equal((await consumerState(q, "pool")).in_flight, 2, "s4, s5 were not completed");
      await vq.complete(q, "pool", [s4, s5]);
    } finally {
      stream.close();
    }
  });

  test("stream.completeWithCredit on a cursor stream rejects consumer_mode_mismatch",
       async () => {
    const q = `bb-cursor-${run}`;
    await vq.enqueue(q, ["c0"]);
    const stream = await vq.stream(q, "reader", { mode: "cursor", credit: 1 });
    try {
      await assert.rejects(stream.completeWithCredit("0.1.abc"),
                           (e: { code?: string }) => e.code === "consumer_mode_mismatch");
    } finally {
      stream.close();
    }
  });
});
