/** The Worker's completions riding on its leases, against a small fake node that answers the
 * lease routes as a node does (docs/work-queues.md) and logs every call. */
import assert from "node:assert/strict";
import * as http from "node:http";
import type { AddressInfo } from "node:net";
import { after, before, describe, test } from "node:test";

import { Client, type Lease, type RefusedCompletion, Worker } from "../src/index.js";

type Json = Record<string, unknown>;

interface Call {
  route: "lease" | "complete" | "prefix-lease" | "prefix-complete";
  queue: string;
  tokens: string[];
  /** A lease was long-polling (holding no records) when this call came. */
  whilePolling: boolean;
  failed: boolean;
}

class FakeNode {
  readonly calls: Call[] = [];
  /** token -> how many times a completion of it was applied (the first time only). */
  readonly applied = new Map<string, number>();
  readonly available: Array<{ queue: string; value: string }> = [];
  /** Tokens whose completion is refused (`lease_expired`). */
  readonly refuse = new Set<string>();
  /** (prefix) Queues this node does not serve: their riding tokens are `wrong_node`. */
  readonly moved = new Set<string>();
  /** The next lease carrying tokens fails (500, not retriable) before doing anything. */
  failNextRiding = false;
  /** A node from before completions rode on leases: `complete` on a lease is a 400. */
  old = false;
  private polls = 0;
  private pollWaiters: Array<() => void> = [];
  private next = 0;
  readonly server: http.Server;

  constructor() {
    this.server = http.createServer((req, res) => void this.handle(req, res));
    this.server.listen(0, "127.0.0.1");
  }

  get url(): string {
    return `http://127.0.0.1:${(this.server.address() as AddressInfo).port}`;
  }

  async started(): Promise<this> {
    if (!this.server.listening) await new Promise((r) => this.server.once("listening", r));
    return this;
  }

  close(): Promise<void> {
    this.server.closeAllConnections();
    return new Promise((r) => this.server.close(() => r()));
  }

  /** Resolves once a lease is long-polling with nothing to give. */
  polling(): Promise<void> {
    return this.polls > 0 ? Promise.resolve() :
      new Promise((resolve) => { this.pollWaiters.push(resolve); });
  }

  tokenOf(value: string): string {
    return `t-${value}`;
  }

  /** Tokens a lease refused as `wrong_node`. */
  readonly wrongNode: string[] = [];

  private complete(queue: string, token: string, prefix: boolean
                   ): "done" | "lease_expired" | "wrong_node" {
    if (prefix && this.moved.has(queue)) return "wrong_node";
    if (this.refuse.has(token)) return "lease_expired";
    if (!this.applied.has(token)) this.applied.set(token, 1);
    return "done";
  }

  private async handle(req: http.IncomingMessage, res: http.ServerResponse): Promise<void> {
    const chunks: Buffer[] = [];
    for await (const c of req) chunks.push(c as Buffer);
    const body = (chunks.length ? JSON.parse(Buffer.concat(chunks).toString()) : {}) as Json;
    const answer = (status: number, out: unknown) => {
      res.writeHead(status, { "Content-Type": "application/json" });
      res.end(JSON.stringify(out));
    };
    const url = req.url ?? "";
    if (url === "/v1/partitions") {
      return answer(200, { partitions: 1, generation: 1,
                           owners: { 0: { node: "n", url: this.url } } });
    }
    const queueRoute = /^\/v1\/queues\/([^/]+)\/consumers\/[^/]+\/(lease|complete)$/.exec(url);
    const prefixRoute = /^\/v1\/prefix-consumers\/[^/]+\/(lease|complete)$/.exec(url);
    if (!queueRoute && !prefixRoute) return answer(200, {});
    const prefix = prefixRoute !== null;
    const kind = (queueRoute ? queueRoute[2] : prefixRoute![1]) as "lease" | "complete";
    const queue = queueRoute ? decodeURIComponent(queueRoute[1]) : "";
    const raw = ((kind === "lease" ? body.complete : body.tokens) ?? []) as unknown[];
    const pairs = raw.map((x) => (prefix ? x as { queue: string; token: string } :
      { queue, token: x as string }));
    const call: Call = { route: prefix ? `prefix-${kind}` : kind, queue,
                         tokens: pairs.map((p) => p.token), whilePolling: this.polls > 0,
                         failed: false };
    this.calls.push(call);
    if (kind === "complete") {
      const wrong = prefix ? pairs.filter((p) => this.moved.has(p.queue)) : [];
      if (wrong.length) {
        return answer(409, { error: { code: "wrong_node", message: "not mine",
                                      retriable: true } });
      }
      const stale = pairs.filter((p) => this.refuse.has(p.token));
      if (stale.length) {
        return answer(409, { error: { code: "lease_expired", message: "stale",
                                      retriable: false,
                                      stale: prefix ? stale : stale.map((p) => p.token) } });
      }
      for (const p of pairs) this.complete(p.queue, p.token, prefix);
      return answer(200, { queue, consumer: "c", done: call.tokens, dead_lettered: [],
                           offset: 0, queues: [] });
    }
    if (kind === "lease" && this.old && body.complete !== undefined) {
      call.failed = true;
      return answer(400, { error: { code: "invalid_parameter", retriable: false,
                                    message: "unknown field(s) ['complete']",
                                    unknown: ["complete"] } });
    }
    if (pairs.length && this.failNextRiding) {
      this.failNextRiding = false;
      call.failed = true;
      return answer(500, { error: { code: "internal", message: "boom", retriable: false } });
    }
    const completed: unknown[] = [];
    const refused: unknown[] = [];
    for (const p of pairs) {
      const outcome = this.complete(p.queue, p.token, prefix);
      if (outcome === "wrong_node") this.wrongNode.push(p.token);
      if (outcome === "done") completed.push(prefix ? p : p.token);
      else refused.push(prefix ? { ...p, code: outcome } : { token: p.token, code: outcome });
    }
    const wanted = body.max_records as number;
    const until = Date.now() + (body.wait_ms as number);
    while (!this.available.length && Date.now() < until) {
      this.polls += 1;
      for (const wake of this.pollWaiters.splice(0)) wake();
      await new Promise((r) => setTimeout(r, 10));
      this.polls -= 1;
    }
    const records = this.available.splice(0, wanted).map((r) => ({
      ...(prefix ? { queue: r.queue, partition: 0 } : {}),
      offset: this.next++, timestamp: Date.now(), value: r.value, headers: {},
      token: this.tokenOf(r.value), attempt: 1, deadline: Date.now() + 60_000 }));
    answer(200, { partition: 0, consumer: "c", records,
                  ...(pairs.length ? { completed, refused } : {}) });
  }
}

describe("a Worker against a fake node", () => {
  let node: FakeNode;
  let vq: Client;

  before(async () => {
    node = await new FakeNode().started();
  });

  after(async () => {
    vq?.close();
    await node.close();
  });

  async function until(done: () => boolean, what: string): Promise<void> {
    const deadline = Date.now() + 15_000;
    while (!done()) {
      if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
      await new Promise((r) => setTimeout(r, 10));
    }
  }

  function fresh(): void {
    node.calls.length = 0;
    node.applied.clear();
    node.refuse.clear();
    node.moved.clear();
    node.wrongNode.length = 0;
    node.old = false;
    vq?.close();
    vq = new Client([node.url]);
  }

  test("a busy worker's tokens ride on its next lease: one HTTP call per cycle", async () => {
    fresh();
    const values = Array.from({ length: 200 }, (_, i) => `busy${i}`);
    node.available.push(...values.map((value) => ({ queue: "busy", value })));
    const errors: unknown[] = [];
    // A generous flush delay: on a loaded machine a lease round trip may take a while, and
    // what is measured here is where the tokens go, not how fast.
    const worker = new Worker(vq, "busy", "c", () => undefined, {
      concurrency: 4, prefetch: 0, waitMs: 200, completeDelayMs: 500,
      onError: (e) => errors.push(e) }).start();
    await until(() => worker.completed === 200, "200 completions");
    await worker.stop();
    assert.deepEqual(errors, []);
    for (const v of values) assert.equal(node.applied.get(node.tokenOf(v)), 1, v);
    const leases = node.calls.filter((c) => c.route === "lease");
    const completes = node.calls.filter((c) => c.route === "complete");
    const riding = leases.reduce((n, c) => n + c.tokens.length, 0);
    // Every cycle's completion went out with the next lease; only the last few records,
    // finished while no lease was due, needed a complete of their own.
    assert.ok(riding >= 200 - 2 * 4, `${riding} tokens rode on leases`);
    assert.ok(completes.length <= 2, `${completes.length} complete calls`);
    assert.equal(node.calls.length, leases.length + completes.length);
  });

  test("a token no lease carries is completed on its own once completeDelayMs passes",
       async () => {
    fresh();
    node.available.push({ queue: "idle", value: "i0" }, { queue: "idle", value: "i1" });
    // Both leased at once; i0 finishes and rides on the next lease, which finds nothing and
    // long-polls; i1 finishes while it does: no lease is due, so a complete sends it.
    const worker = new Worker(vq, "idle", "c", async (lease: Lease) => {
      if (lease.text === "i1") await node.polling();
    }, { concurrency: 2, prefetch: 0, waitMs: 1_000 }).start();
    await until(() => worker.completed === 2, "2 completions");
    const leases = node.calls.filter((c) => c.route === "lease");
    const completes = node.calls.filter((c) => c.route === "complete");
    assert.deepEqual(leases[0].tokens, []);
    assert.deepEqual(leases[1].tokens, [node.tokenOf("i0")]);
    assert.deepEqual(completes.map((c) => [c.tokens, c.whilePolling]),
                     [[[node.tokenOf("i1")], true]]);
    await worker.stop();
    assert.equal(node.applied.size, 2);
  });

  test("completions refused riding or standalone are reported token by token", async () => {
    fresh();
    node.available.push({ queue: "ref", value: "r0" }, { queue: "ref", value: "r1" });
    node.refuse.add(node.tokenOf("r0")).add(node.tokenOf("r1"));
    const refused: RefusedCompletion[] = [];
    const errors: unknown[] = [];
    // As above: r0's token rides (refused in the lease's answer), r1's goes alone (409).
    const worker = new Worker(vq, "ref", "c", async (lease: Lease) => {
      if (lease.text === "r1") await node.polling();
    }, { concurrency: 2, prefetch: 0, waitMs: 1_000, onRefused: (r) => refused.push(r),
         onError: (e) => errors.push(e) }).start();
    await until(() => refused.length === 2, "2 refusals");
    await worker.stop();
    // (r1's refusal comes first: r0's lease answers only at the end of its long poll.)
    assert.deepEqual(refused.map((r) => [r.queue, r.token, r.code, r.lease.token]).sort(), [
      ["ref", node.tokenOf("r0"), "lease_expired", node.tokenOf("r0")],
      ["ref", node.tokenOf("r1"), "lease_expired", node.tokenOf("r1")]]);
    assert.deepEqual(node.calls.filter((c) => c.route === "complete").map((c) => c.tokens),
                     [[node.tokenOf("r1")]]);
    assert.deepEqual(errors, []);
    assert.equal(worker.completed, 0);
  });

  test("a failed lease's tokens are sent again; stop() completes the rest", async () => {
    fresh();
    const values = Array.from({ length: 20 }, (_, i) => `s${i}`);
    node.available.push(...values.map((value) => ({ queue: "stop", value })));
    node.failNextRiding = true;
    let release!: () => void;
    const released = new Promise<void>((r) => { release = r; });
    const errors: unknown[] = [];
    // s19's handler returns only once stop() was called: no lease carries its token.
    const worker = new Worker(vq, "stop", "c", async (lease: Lease) => {
      if (lease.text === "s19") await released;
    }, { concurrency: 2, prefetch: 0, waitMs: 200, completeDelayMs: 500,
         onError: (e) => errors.push(e) }).start();
    await until(() => worker.completed === 19, "19 completions");
    const stopped = worker.stop();
    release();
    await stopped;
    assert.equal(worker.completed, 20);
    for (const v of values) assert.equal(node.applied.get(node.tokenOf(v)), 1, v);
    const failed = node.calls.filter((c) => c.failed);
    assert.equal(failed.length, 1);
    assert.ok(failed[0].tokens.length > 0);
    const later = node.calls.slice(node.calls.indexOf(failed[0]) + 1).flatMap((c) => c.tokens);
    for (const t of failed[0].tokens) assert.ok(later.includes(t), `${t} was not sent again`);
    assert.deepEqual(errors.map((e) => (e as { code?: string }).code), ["internal"]);
    const last = node.calls.filter((c) => c.route === "complete").at(-1);
    assert.ok(last?.tokens.includes(node.tokenOf("s19")), JSON.stringify(node.calls.at(-1)));
  });

  test("a worker completes alone on a node that takes no completions on a lease", async () => {
    fresh();
    node.old = true;  // a rolling upgrade: this node predates completions on leases
    const values = Array.from({ length: 60 }, (_, i) => `old${i}`);
    node.available.push(...values.map((value) => ({ queue: "old", value })));
    const errors: unknown[] = [];
    const worker = new Worker(vq, "old", "c", () => undefined, {
      concurrency: 4, prefetch: 0, waitMs: 100, completeDelayMs: 50,
      onError: (e) => errors.push(e) }).start();
    await until(() => worker.completed === 60, "60 completions");
    await worker.stop();
    assert.deepEqual(errors, []);
    for (const v of values) assert.equal(node.applied.get(node.tokenOf(v)), 1, v);
    const refusedRides = node.calls.filter((c) => c.route === "lease" && c.failed);
    assert.ok(refusedRides.length <= 1, `${refusedRides.length} leases carried tokens`);
    assert.ok(node.calls.some((c) => c.route === "complete"));
  });

  test("a prefix worker completes a wrong_node refusal with the queue's owner", async () => {
    fresh();
    const values = Array.from({ length: 8 }, (_, i) => `w${i}`);
    node.available.push(...values.map((value, i) => ({ queue: i % 2 ? "moved" : "here",
                                                       value })));
    node.moved.add("moved");
    const refused: RefusedCompletion[] = [];
    const worker = new Worker(vq, null, "c", () => undefined, {
      prefix: true, concurrency: 2, prefetch: 0, waitMs: 200, completeDelayMs: 500,
      mapRefreshMs: 60_000, onRefused: (r) => refused.push(r) }).start();
    await until(() => worker.completed === 8, "8 completions");
    await worker.stop();
    assert.deepEqual(refused, []);
    for (const v of values) assert.equal(node.applied.get(node.tokenOf(v)), 1, v);
    // Each of the moved queue's tokens was refused by the node the lease went to (riding, or
    // in a prefix complete), then completed by a per-queue complete, which the client routes
    // to the queue's owner (here the fake again, on the per-queue route).
    const movedTokens = values.filter((_, i) => i % 2).map((v) => node.tokenOf(v));
    const byQueue = node.calls.filter((c) => c.route === "complete").flatMap((c) => c.tokens);
    for (const t of movedTokens) assert.ok(byQueue.includes(t), `${t}: ${JSON.stringify(byQueue)}`);
    assert.ok(node.wrongNode.length > 0, "no lease carried a moved queue's token");
  });
});
