/** The client against a real two-node cluster (`vqueues dev`, the embedded broker). */
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { after, before, describe, test } from "node:test";

import {
  BadRequestError, BatchProducer, Client, ConflictError, type CreditCompletion, ERROR_CODES,
  type Lease, NotFoundError,
  type RefusedCompletion, SCHEMA_FIELDS, Worker, type WorkerOptions, WrongNodeError, consume, partitionFor,
  sleep,
} from "../src/index.js";
import { DevCluster } from "./cluster.js";

const run = randomUUID().slice(0, 6);

describe("against two nodes", { timeout: 240_000 }, () => {
  let cluster: DevCluster;
  let vq: Client;

  before(async () => {
    cluster = await DevCluster.start(2);
    vq = new Client(cluster.urls);
    await vq.refreshMap();
  });

  after(async () => {
    vq?.close();
    await cluster?.stop();
  });

  test("the hand-written answer types match the OpenAPI document the node serves", async () => {
    const doc = await (await fetch(`${cluster.urls[0]}/v1/openapi.json`)).json() as {
      components: { schemas: Record<string, { properties: Record<string, unknown> }> } };
    for (const [name, fields] of Object.entries(SCHEMA_FIELDS)) {
      const schema = doc.components.schemas[name];
      assert.ok(schema, `${name} is not in the OpenAPI document`);
      assert.deepEqual([...fields].sort(), Object.keys(schema.properties).sort(), name);
    }
    assert.ok(Object.keys(ERROR_CODES).includes("wrong_node"));
  });

  test("enqueue, read with a long poll, ack, queue info, delete", async () => {
    const q = `ts-basic-${run}`;
    const res = await vq.enqueue(q, ["one", new Uint8Array([0, 1, 255]),
                                     { value: "three", headers: { kind: "x" }, tags: ["red"] }],
                                 { headers: { src: "test" } });
    assert.equal(res.partition, partitionFor(q, vq.partitions!));
    assert.equal(res.offsets!.length, 3);
    const page = await vq.read(q, { consumer: "c", limit: 10 });
    assert.deepEqual(page.records.map((r) => r.offset), res.offsets);
    assert.equal(page.records[0].text, "one");
    assert.deepEqual(page.records[0].headers, { src: "test" });
    assert.deepEqual([...page.records[1].value!], [0, 1, 255]);
    assert.equal(page.records[2].headers.kind, "x");
    const red = await vq.read(q, { tag: "red" });
    assert.deepEqual(red.records.map((r) => r.text), ["three"]);
    await vq.ack(q, "c", page.nextOffset);
    const waited = Date.now();
    const empty = await vq.read(q, { consumer: "c", waitMs: 300 });
    assert.equal(empty.records.length, 0);
    assert.ok(Date.now() - waited >= 250, "the read long-polled");
    const info = await vq.queueInfo(q);
    assert.equal(info!.records, 3);
    assert.equal((info!.consumers as Array<{ offset: number }>)[0].offset, page.nextOffset);
    assert.ok(await vq.deleteConsumer(q, "c"));
    assert.ok(await vq.deleteQueue(q));
    assert.equal(await vq.queueInfo(q), null);
  });

  test("consume handles every record once and acks; nodes; findOffset", async () => {
    const q = `ts-consume-${run}`;
    const first = await vq.enqueue(q, ["c0", "c1", "c2"]);
    const before = Date.now();
    await new Promise((r) => setTimeout(r, 20));
    await vq.enqueue(q, ["c3", "c4"]);
    const seen: string[] = [];
    const handled = await consume(vq, q, "loop", (rec) => { seen.push(rec.text!); },
                                  { limit: 2, waitMs: 200, maxRecords: 5 });
    assert.equal(handled, 5);
    assert.deepEqual(seen, ["c0", "c1", "c2", "c3", "c4"]);
    const info = await vq.queueInfo(q);
    assert.equal(info!.consumers[0].offset, info!.last_offset! + 1);
    // A handler that throws: the records before it are acked, the failing one comes again.
    await vq.enqueue(q, ["d0", "boom"]);
    await assert.rejects(consume(vq, q, "loop", (rec) => {
      if (rec.text === "boom") throw new Error("boom");
    }, { waitMs: 200 }), /boom/);
    const again = await vq.read(q, { consumer: "loop" });
    assert.equal(again.records[0].text, "boom");
    const nodes = await vq.nodes();
    assert.equal(nodes.length, 2);
    assert.ok(nodes.every((n) => n.status === "ready"));
    const at = await vq.findOffset(q, before + 10);
    assert.ok(at > first.offsets![2] && at <= info!.last_offset!);
  });

  test("idempotency keys, scheduled records and their cancellation", async () => {
    const q = `ts-keys-${run}`;
    const a = await vq.enqueue(q, "once", { idempotencyKey: "k1" });
    const b = await vq.enqueue(q, "once", { idempotencyKey: "k1" });
    assert.deepEqual(a.offsets, b.offsets);
    await assert.rejects(vq.enqueue(q, "other", { idempotencyKey: "k1" }),
                         (e: ConflictError) => e.code === "idempotency_key_reused" &&
                           e instanceof ConflictError && !e.retriable);
    const later = await vq.enqueue(q, "later", { delayMs: 60_000 });
    const soon = await vq.enqueue(q, "soon", { delayMs: 200 });
    assert.ok(await vq.cancelScheduled(q, later.offsets![0]));
    assert.equal(await vq.cancelScheduled(q, later.offsets![0]), null);
    const page = await vq.read(q, { offset: (soon.offsets![0]) + 1, waitMs: 5_000 });
    assert.deepEqual(page.records.map((r) => r.text), ["soon"]);
  });

  test("a stale map is corrected by the 409 wrong_node and its refresh", async () => {
    const stale = new Client(cluster.urls[0], { refreshIntervalMs: 3_600_000 });
    try {
      await stale.refreshMap();
      const urls = [...new Set(stale.owners.values())].sort();
      assert.equal(urls.length, 2, "both nodes own partitions");
      for (const [p, u] of stale.owners) stale.owners.set(p, urls[(urls.indexOf(u) + 1) % 2]);
      const q = `ts-stale-${run}`;
      const res = await stale.enqueue(q, "found its way");
      assert.ok(res.offsets);
      assert.equal(stale.owners.get(res.partition), vq.owners.get(res.partition));
      // Asked directly, the wrong node answers a typed 409 naming the owner.
      const owner = vq.owners.get(res.partition)!;
      const other = urls.find((u) => u !== owner)!;
      const wrong = new Client(other, { refreshIntervalMs: 3_600_000, deadlineMs: 0 });
      try {
        await assert.rejects(wrong.callNode(other, "POST", `/v1/queues/${q}/records`,
                                            { records: [{ value: "x" }] }),
                             (e: WrongNodeError) => e instanceof WrongNodeError &&
                               e.owner === owner && e.status === 409);
      } finally {
        wrong.close();
      }
    } finally {
      stale.close();
    }
  });

  test("bad input is a typed, non-retriable error", async () => {
    await assert.rejects(vq.call("POST", "ts-bad", "/v1/queues/ts-bad/records",
                                 { body: { records: [{ value: 5 }] } }),
                         (e: BadRequestError) => e instanceof BadRequestError &&
                           e.code === "invalid_record" && !e.retriable && e.status === 400);
  });

  test("enqueueMany writes to many queues over both nodes, each queue in order", async () => {
    const queues = Array.from({ length: 30 }, (_, i) => `ts-many-${run}-${i}`);
    const items: Array<[string, string]> = [];
    for (let k = 0; k < 3; k++) for (const q of queues) items.push([q, `${q}:${k}`]);
    const results = await vq.enqueueMany(items);
    assert.ok(results.every((r) => r.error === undefined && r.offset !== null));
    assert.deepEqual(results.map((r) => r.queue), items.map(([q]) => q));
    for (const q of queues.slice(0, 5)) {
      const page = await vq.read(q);
      assert.deepEqual(page.records.map((r) => r.text), [0, 1, 2].map((k) => `${q}:${k}`));
    }
  });

  test("the BatchProducer keeps each queue's order over many queues", async () => {
    const queues = Array.from({ length: 50 }, (_, i) => `ts-batch-${run}-${i}`);
    const producer = new BatchProducer(vq, { lingerMs: 5, maxBatch: 200 });
    const sent: Array<Promise<number | null>> = [];
    for (let k = 0; k < 6; k++) {
      for (const q of queues) sent.push(producer.send(q, `${q}:${k}`));
      await new Promise((r) => setTimeout(r, 1));
    }
    await producer.flush();
    const offsets = await Promise.all(sent);
    assert.ok(producer.requests <= 20, `${producer.requests} requests`);
    for (const [i, q] of queues.entries()) {
      const mine = offsets.filter((_, n) => n % queues.length === i);
      assert.deepEqual(mine, [...mine].sort((a, b) => a! - b!));
      const page = await vq.read(q);
      assert.deepEqual(page.records.map((r) => r.text),
                       [0, 1, 2, 3, 4, 5].map((k) => `${q}:${k}`));
    }
  });

  test("lease, extend, retry and complete; a consumer's settings", async () => {
    const q = `ts-work-${run}`;
    const settings = await vq.configureConsumer(q, "w", { mode: "lease", maxAttempts: 3,
                                                          visibilityMs: 10_000 });
    assert.equal(settings.mode, "lease");
    assert.equal(settings.durable_grants, false);
    assert.equal((await vq.consumerSettings(q, "w"))!.max_attempts, 3);
    const durable = await vq.configureConsumer(q, "w", { durableGrants: true });
    assert.deepEqual([durable.durable_grants, durable.max_attempts], [true, 3]);
    await vq.enqueue(q, ["a", "b"]);
    const leases = await vq.lease(q, "w", { maxRecords: 2 });
    assert.deepEqual(leases.map((l) => l.text), ["a", "b"]);
    const extended = await vq.extend(q, "w", leases[0], 20_000);
    assert.ok((extended.deadline as number) > leases[0].deadline);
    await vq.retry(q, "w", leases[1], { delayMs: 0 });
    await vq.complete(q, "w", leases[0]);
    await vq.complete(q, "w", leases[0].token);  // completing again is safe
    const again = await vq.lease(q, "w", { maxRecords: 5, waitMs: 2_000 });
    assert.deepEqual(again.map((l) => [l.text, l.attempt]), [["b", 2]]);
    // The first grant's token, now that the record is leased again: 409 lease_expired.
    await assert.rejects(vq.complete(q, "w", leases[1].token),
                         (e: ConflictError) => e.code === "lease_expired" &&
                           e instanceof ConflictError);
    await vq.complete(q, "w", again);
  });

  test("a lease completes the tokens it carries first, token by token", async () => {
    const q = `ts-ride-${run}`;
    await vq.configureConsumer(q, "w", { mode: "lease" });
    await vq.enqueue(q, ["a", "b", "c"]);
    const first = await vq.lease(q, "w", { maxRecords: 2 });
    assert.deepEqual(first.map((l) => l.text), ["a", "b"]);
    assert.deepEqual([first.completed, first.refused], [[], []]);
    const second = await vq.lease(q, "w", { maxRecords: 5,
                                            complete: [first[0], first[1].token, "nonsense"] });
    assert.deepEqual(second.map((l) => l.text), ["c"]);
    assert.deepEqual(second.completed, [first[0].token, first[1].token]);
    assert.deepEqual(second.refused, [{ token: "nonsense", code: "invalid_token" }]);
    // Sent again (the answer lost, say): found done already, so completed again.
    const third = await vq.lease(q, "w", { complete: [...first, ...second] });
    assert.deepEqual([third.length, third.completed.length, third.refused], [0, 3, []]);
    const pool = (await vq.queueInfo(q))!.consumers.find((c) => c.consumer === "w")!;
    assert.deepEqual([pool.lag, pool.in_flight], [0, 0]);
  });

  test("a lease stream under credit, settled on the socket; a cursor stream acked", async () => {
    const q = `ts-stream-${run}`;
    await vq.configureConsumer(q, "s", { mode: "lease" });
    await vq.enqueue(q, ["s0", "s1", "s2", "s3", "s4"]);
    const stream = await vq.stream(q, "s", { credit: 2 });
    const got: string[] = [];
    for await (const item of stream) {
      const lease = item as Lease;
      got.push(lease.text!);
      const done = await stream.complete(lease);
      assert.deepEqual(done.done, [lease.token]);
      if (got.length === 5) break;
    }
    stream.close();
    assert.deepEqual(got, ["s0", "s1", "s2", "s3", "s4"]);
    assert.equal((await vq.lease(q, "s", { maxRecords: 5 })).length, 0);

    const c = `ts-cursor-stream-${run}`;
    const written = await vq.enqueue(c, ["c0", "c1"]);
    const cursor = await vq.stream(c, "reader", { mode: "cursor", credit: 10 });
    const seen: string[] = [];
    for await (const rec of cursor) {
      seen.push(rec.text!);
      if (seen.length === 2) break;
    }
    const acked = await cursor.ack(written.offsets![1] + 1);
    cursor.close();
    assert.deepEqual(seen, ["c0", "c1"]);
    assert.equal(acked.offset, written.offsets![1] + 1);
  });

  test("a plain credit the node refuses does not end the stream; its end does", async () => {
    const q = `ts-stream-refused-credit-${run}`;
    await vq.configureConsumer(q, "s", { mode: "lease" });
    const stream = await vq.stream(q, "s", { credit: 1 });
    stream.credit(10_000);  // 10,001 outstanding: refused (limit_out_of_range), no id to echo
    // Frames are answered in order: this op's answer comes after the credit's refusal.
    await assert.rejects(stream.complete("x.y"), { code: "invalid_token" });
    await vq.enqueue(q, ["a", "b"]);
    const got: string[] = [];
    for await (const item of stream) {
      got.push((item as Lease).text!);
      await stream.complete(item as Lease);
      if (got.length === 2) break;
    }
    stream.close();
    assert.deepEqual(got, ["a", "b"]);

    // A lease stream of a cursor consumer cannot go on: the node's final frame ends it.
    const c = `ts-stream-final-${run}`;
    const written = await vq.enqueue(c, ["c0"]);
    await vq.ack(c, "r", written.offsets![0]);
    const ended = await vq.stream(c, "r", { mode: "lease", credit: 1 });
    await assert.rejects((async () => { for await (const _ of ended) break; })(),
                         { code: "consumer_mode_mismatch" });
  });

  test("a lease stream's completions ride on its credit, answered token by token", async () => {
    const q = `ts-stream-ride-${run}`;
    await vq.configureConsumer(q, "s", { mode: "lease" });
    const written = await vq.enqueue(q, ["r0", "r1", "r2", "r3", "r4", "r5"]);
    // No completion goes alone within the test: each answer below came with a credit frame.
    const stream = await vq.stream(q, "s", { credit: 2, completeDelayMs: 600_000 });
    const leases: Lease[] = [];
    const answers: Array<Promise<CreditCompletion>> = [];
    for await (const item of stream) {
      const lease = item as Lease;
      leases.push(lease);
      answers.push(stream.completeWithCredit(lease));  // carried by the next record's credit
      if (leases.length === 5) break;
    }
    assert.deepEqual(leases.map((l) => l.text), ["r0", "r1", "r2", "r3", "r4"]);
    for (let i = 0; i < 4; i++) {
      assert.deepEqual(await answers[i], { completed: [leases[i].token], refused: [] });
    }
    // r4's completion waits for a credit frame: one granted by hand carries it.
    const bogus = stream.completeWithCredit(["nonsense", leases[4]]);
    stream.credit(1);
    assert.deepEqual(await answers[4], { completed: [leases[4].token], refused: [] });
    assert.deepEqual(await bogus, { completed: [leases[4].token],
                                    refused: [{ token: "nonsense", code: "invalid_token" }] });
    stream.close();
    const info = (await vq.queueInfo(q))!.consumers.find((c) => c.consumer === "s")!;
    assert.equal(info.offset, written.offsets![4] + 1);  // r0-r4 done

    // Awaited before the next record is taken: no credit frame comes, so they go alone, still
    // answered token by token.
    const q2 = `ts-stream-alone-${run}`;
    await vq.configureConsumer(q2, "s", { mode: "lease" });
    await vq.enqueue(q2, ["a0", "a1"]);
    const alone = await vq.stream(q2, "s", { credit: 1, completeDelayMs: 20 });
    for await (const item of alone) {
      const lease = item as Lease;
      assert.deepEqual(await alone.completeWithCredit([lease, "nonsense"]), {
        completed: [lease.token], refused: [{ token: "nonsense", code: "invalid_token" }] });
      break;
    }
    alone.close();

    // On a cursor stream the node refuses such a frame (409 consumer_mode_mismatch) and adds
    // none of its credit: the stream grants it again, so records keep coming.
    const c = `ts-stream-cursor-ride-${run}`;
    await vq.enqueue(c, ["c0", "c1", "c2"]);
    const cursor = await vq.stream(c, "r", { mode: "cursor", credit: 1 });
    const seen: string[] = [];
    let refused: Promise<unknown> | undefined;
    const taking = (async () => {
      for await (const rec of cursor) {
        seen.push(rec.text!);
        if (seen.length === 1) refused = cursor.completeWithCredit("1.1.1").catch((e) => e);
        if (seen.length === 3) break;
      }
    })();
    const stalled = await Promise.race([taking.then(() => false), sleep(20_000).then(() => true)]);
    cursor.close();
    assert.deepEqual([stalled, seen], [false, ["c0", "c1", "c2"]]);
    assert.equal(((await refused) as { code: string }).code, "consumer_mode_mismatch");
  });

  test("a prefix consumer: one Worker over every queue under the prefix, on both nodes",
       async () => {
    const pool = `ts-prefix-${run}`;
    const prefix = `tsp-${run}-`;
    const defined = await vq.configurePrefixConsumer(pool, prefix, { maxAttempts: 3,
                                                                     recordsPerTurn: 5 });
    assert.equal(defined.prefix, prefix);
    const queues = Array.from({ length: 12 }, (_, i) => `${prefix}${i}`);
    const results = await vq.enqueueMany(queues.flatMap((q) => [0, 1, 2].map(
      (k): [string, string] => [q, `${q}:${k}`])));
    assert.ok(results.every((r) => r.error === undefined));
    const owners = new Set(queues.map((q) => vq.cachedOwner(q)));
    assert.equal(owners.size, 2, "the queues are spread over both nodes");
    // By hand first: a lease from one node names its queues; settle them with that node.
    const node = [...owners][0];
    let leases: Lease[] = [];
    const until = Date.now() + 10_000;
    while (!leases.length && Date.now() < until) {
      try {
        leases = await vq.leasePrefix(pool, node, { maxRecords: 4, waitMs: 500 });
      } catch (exc) {
        // Every node learns a definition from the assignment topic's tail: 404 until then.
        if (!(exc instanceof NotFoundError)) throw exc;
      }
    }
    assert.ok(leases.length && leases.every((l) => l.queue?.startsWith(prefix)));
    await vq.extendPrefix(pool, node, leases, 20_000);
    await vq.completePrefix(pool, node, leases);
    const handled = new Set(leases.map((l) => l.text!));
    // A lease carries tokens to complete: of its node's queues (done already here: completed
    // again), and one of the other node's, refused as wrong_node.
    const other = [...owners][1];
    let elsewhere: Lease[] = [];
    while (!elsewhere.length && Date.now() < until + 10_000) {
      try {
        elsewhere = await vq.leasePrefix(pool, other, { maxRecords: 1, waitMs: 500 });
      } catch (exc) {
        if (!(exc instanceof NotFoundError)) throw exc;
      }
    }
    assert.equal(elsewhere.length, 1);
    const riding = await vq.leasePrefix(pool, node, { maxRecords: 1,
                                                      complete: [...leases, ...elsewhere] });
    const pair = (l: { queue?: string; token: string }) => `${l.queue}/${l.token}`;
    assert.deepEqual(riding.completed.map(pair).sort(), leases.map(pair).sort());
    assert.deepEqual(riding.refused, [{ queue: elsewhere[0].queue, token: elsewhere[0].token,
                                        code: "wrong_node" }]);
    await vq.completePrefix(pool, other, elsewhere);
    await vq.completePrefix(pool, node, riding);
    for (const l of [...elsewhere, ...riding]) handled.add(l.text!);
    const started = handled.size;
    const refused: RefusedCompletion[] = [];
    const rode: string[] = [];  // each token a worker's lease carried, and the node it went to
    const leasedFrom = new Map<string, string>();
    const leasePrefix = vq.leasePrefix.bind(vq);
    vq.leasePrefix = async (...args: Parameters<Client["leasePrefix"]>) => {
      for (const l of args[2]?.complete ?? []) rode.push(`${args[1]} ${pair(l)}`);
      const out = await leasePrefix(...args);
      for (const l of out) leasedFrom.set(pair(l), args[1]);
      return out;
    };
    const worker = new Worker(vq, null, pool, (lease: Lease) => {
      handled.add(lease.text!);
    }, { prefix: true, concurrency: 4, waitMs: 300, mapRefreshMs: 200,
         onRefused: (r) => refused.push(r) }).start();
    const deadline = Date.now() + 30_000;
    try {
      while (handled.size < 36 && Date.now() < deadline) {
        await new Promise((r) => setTimeout(r, 100));
      }
      await worker.stop();
    } finally {
      delete (vq as Partial<Client>).leasePrefix;  // the prototype's again
    }
    assert.equal(handled.size, 36);
    assert.equal(worker.completed, 36 - started);
    assert.deepEqual(refused, []);
    // Tokens rode only on leases to the node that leased them.
    assert.ok(rode.length > 0);
    for (const entry of rode) {
      const [to, token] = entry.split(" ");
      assert.equal(leasedFrom.get(token), to, entry);
    }
    const listed = await vq.prefixConsumers();
    assert.ok(listed.some((p) => p.consumer === pool));
    const names = await vq.listQueues(prefix);
    assert.deepEqual(names, [...queues].sort());
    assert.ok(await vq.deletePrefixConsumer(pool));
  });

  /** A Worker on `q` until it handled `total` records (30 s at most), then stopped: the
   * records it handled, and the worker. */
  async function drainWithWorker(q: string, consumer: string, total: number,
                                 options: WorkerOptions): Promise<[string[], Worker]> {
    const done: string[] = [];
    const worker = new Worker(vq, q, consumer, (lease: Lease) => { done.push(lease.text!); },
                              options).start();
    const deadline = Date.now() + 30_000;
    while (done.length < total && Date.now() < deadline) {
      await new Promise((r) => setTimeout(r, 50));
    }
    await worker.stop();
    return [done, worker];
  }

  test("a Worker's completions ride on its leases: every record completed once", async () => {
    const q = `ts-batch-${run}`;
    await vq.enqueue(q, Array.from({ length: 300 }, (_, i) => `r${i}`));
    const completed: string[] = [];  // the tokens the node answered completed
    let riding = 0;  // tokens carried by leases
    const calls: number[] = [];  // records per standalone complete call
    const complete = vq.complete.bind(vq);
    vq.complete = async (...args: Parameters<Client["complete"]>) => {
      calls.push(Array.isArray(args[2]) ? args[2].length : 1);
      const out = await complete(...args);
      completed.push(...out.done);
      return out;
    };
    const lease = vq.lease.bind(vq);
    vq.lease = async (...args: Parameters<Client["lease"]>) => {
      const out = await lease(...args);
      riding += (args[2]?.complete as unknown[] | undefined)?.length ?? 0;
      completed.push(...out.completed);
      return out;
    };
    let done: string[];
    try {
      let worker: Worker;
      [done, worker] = await drainWithWorker(q, "batch", 300, { concurrency: 8, waitMs: 300 });
      assert.equal(worker.completed, 300);
    } finally {
      delete (vq as Partial<Client>).complete;  // the prototype's again
      delete (vq as Partial<Client>).lease;
    }
    assert.deepEqual(done.sort(), Array.from({ length: 300 }, (_, i) => `r${i}`).sort());
    // Each record's token completed once, most on the next lease, the rest in completes.
    assert.equal(completed.length, 300);
    assert.equal(new Set(completed).size, 300);
    assert.equal(riding + calls.reduce((a, b) => a + b, 0), 300);
    assert.ok(riding > 0, "no token rode on a lease");
    const info = await vq.queueInfo(q);
    const pool = info!.consumers.find((c) => c.consumer === "batch")!;
    assert.deepEqual([pool.lag, pool.in_flight], [0, 0]);
  });

  test("a Worker with quick handlers leases ahead of its slots, in large calls", async () => {
    const drain = async (q: string, prefetch?: number): Promise<number[]> => {
      await vq.enqueue(q, Array.from({ length: 600 }, (_, i) => `r${i}`));
      const sizes: number[] = [];  // records asked for per lease call
      const lease = vq.lease.bind(vq);
      vq.lease = async (...args: Parameters<Client["lease"]>) => {
        sizes.push(args[2]?.maxRecords ?? 1);
        return await lease(...args);
      };
      let done: string[];
      try {
        let worker: Worker;
        [done, worker] = await drainWithWorker(q, "ahead", 600,
                                               { concurrency: 4, waitMs: 300, prefetch });
        assert.equal(worker.completed, 600);
      } finally {
        delete (vq as Partial<Client>).lease;  // the prototype's again
      }
      assert.deepEqual(done.sort(), Array.from({ length: 600 }, (_, i) => `r${i}`).sort());
      return sizes;
    };
    // Leasing only for the free slots (prefetch 0): calls of 4 at most, one per 4 records.
    const slots = await drain(`ts-ahead0-${run}`, 0);
    assert.ok(Math.max(...slots) <= 4 && slots.length >= 150, `${slots.length} calls`);
    // By default quick handlers get records leased ahead: calls of up to 100.
    const ahead = await drain(`ts-ahead-${run}`);
    assert.ok(Math.max(...ahead) > 4, `largest call ${Math.max(...ahead)}`);
    assert.ok(ahead.length < 60, `${ahead.length} lease calls for 600 records`);
  });

  test("a Worker extends the leases of records waiting for a slot", async () => {
    const q = `ts-extend-${run}`;
    await vq.enqueue(q, Array.from({ length: 10 }, (_, i) => `r${i}`));
    const attempts: string[] = [];
    const errors: unknown[] = [];
    // One slot, 150 ms a record, all ten leased at once for 1 s: the last ones wait over a
    // second for the slot, and would be leased again (attempt 2) unless extended meanwhile.
    const worker = new Worker(vq, q, "slow", async (lease: Lease) => {
      attempts.push(`${lease.text}#${lease.attempt}`);
      await new Promise((r) => setTimeout(r, 150));
    }, { concurrency: 1, prefetch: 10, visibilityMs: 1_000, extendBeforeMs: 600, waitMs: 300,
         onError: (e) => errors.push(e) }).start();
    const deadline = Date.now() + 30_000;
    while (worker.completed < 10 && Date.now() < deadline) {
      await new Promise((r) => setTimeout(r, 50));
    }
    await worker.stop();
    assert.deepEqual(attempts.sort(), Array.from({ length: 10 }, (_, i) => `r${i}#1`).sort());
    assert.deepEqual(errors, []);
    assert.equal(worker.completed, 10);
    const pool = (await vq.queueInfo(q))!.consumers.find((c) => c.consumer === "slow")!;
    assert.deepEqual([pool.lag, pool.in_flight], [0, 0]);
  });

  test("a Worker reports a stale token's refused completion and completes the rest",
       async () => {
    const q = `ts-stale-token-${run}`;
    await vq.enqueue(q, ["victim", ...Array.from({ length: 19 }, (_, i) => `r${i}`)]);
    let again!: () => void;
    const leasedAgain = new Promise<void>((resolve) => { again = resolve; });
    let seen!: () => void;
    const refusedSeen = new Promise<void>((resolve) => { seen = resolve; });
    const refused: RefusedCompletion[] = [];
    const errors: unknown[] = [];
    const handled: string[] = [];
    let staleToken = "";
    // The victim's first handler gives its record back behind the worker's back, waits for
    // it to be leased again, and returns: its token, stale now, is sent (riding on a lease or
    // in a complete) while the second delivery's handler holds the record, so the node
    // refuses it (lease_expired) whichever way it goes.
    const worker = new Worker(vq, q, "stale", async (lease: Lease) => {
      handled.push(`${lease.text}#${lease.attempt}`);
      if (lease.text !== "victim") return;
      if (lease.attempt === 1) {
        staleToken = lease.token;
        await vq.retry(q, "stale", [lease], { delayMs: 0 });
        await leasedAgain;
      } else {
        again();
        await Promise.race([refusedSeen, new Promise((r) => setTimeout(r, 10_000))]);
      }
    }, { concurrency: 4, waitMs: 300, onError: (e) => errors.push(e),
         onRefused: (r) => { refused.push(r); seen(); } }).start();
    const deadline = Date.now() + 30_000;
    while (worker.completed < 20 && Date.now() < deadline) {
      await new Promise((r) => setTimeout(r, 50));
    }
    await worker.stop();
    assert.equal(handled.length, 21, JSON.stringify(handled));
    assert.ok(handled.includes("victim#1") && handled.includes("victim#2"));
    assert.deepEqual(errors, []);
    assert.deepEqual(refused.map((r) => [r.queue, r.token, r.code, r.lease.text]),
                     [[q, staleToken, "lease_expired", "victim"]]);
    assert.equal(worker.completed, 20);
    const pool = (await vq.queueInfo(q))!.consumers.find((c) => c.consumer === "stale")!;
    assert.deepEqual([pool.lag, pool.in_flight], [0, 0]);
  });

  test("a Worker handles every record; a poison record reaches the dead-letter queue",
       async () => {
    const q = `ts-pool-${run}`;
    const dlq = `ts-pool-dlq-${run}`;
    await vq.configureConsumer(q, "pool", { mode: "lease", maxAttempts: 2,
                                            deadLetterQueue: dlq });
    await vq.enqueue(q, [...Array.from({ length: 20 }, (_, i) => `job-${i}`), "poison"]);
    const done: string[] = [];
    const worker = new Worker(vq, q, "pool", (lease: Lease) => {
      if (lease.text === "poison") throw new Error("cannot handle it");
      done.push(lease.text!);
    }, { concurrency: 4, backoffInitialMs: 50, waitMs: 500 }).start();
    let dead: string[] = [];
    const deadline = Date.now() + 30_000;
    while ((done.length < 20 || !dead.length) && Date.now() < deadline) {
      await new Promise((r) => setTimeout(r, 100));
      dead = (await vq.read(dlq)).records.map((r) => r.text!);
    }
    await worker.stop();
    assert.deepEqual(done.sort(), Array.from({ length: 20 }, (_, i) => `job-${i}`).sort());
    assert.deepEqual(dead, ["poison"]);
    assert.equal(worker.completed, 20);
    assert.ok(worker.retried >= 2, `${worker.retried} retries`);
  });
});
