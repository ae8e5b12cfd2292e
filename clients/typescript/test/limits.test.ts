/** Multi-queue enqueues within the node's limits, a bad record failed alone, and retries while
 * no node answers: against a small fake node (fast), then a real one with low limits. */
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import * as http from "node:http";
import type { AddressInfo } from "node:net";
import { after, before, describe, test } from "node:test";

import {
  BatchProducer, Client, DEFAULT_MAX_BODY_BYTES, DeadlineExceededError, type VQError,
} from "../src/index.js";
import { DevCluster } from "./cluster.js";

type Json = Record<string, unknown>;
const KB = 1024;

/** Answers the map and the multi-queue enqueue as a node does: a body over `maxBody` is 413
 * payload_too_large naming no record; a bad queue name, a value over `maxRecord` or a tag with
 * a comma refuses the whole request naming `records[i]`. */
class FakeNode {
  readonly log: Array<[string, string]> = [];
  readonly bodies: number[] = [];
  limits: Json | null = null;
  maxBody: number | null = null;
  maxRecord = 1024 * KB;
  readonly server: http.Server;

  constructor(port = 0) {
    this.server = http.createServer((req, res) => void this.handle(req, res));
    this.server.listen(port, "127.0.0.1");
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

  private async handle(req: http.IncomingMessage, res: http.ServerResponse): Promise<void> {
    const chunks: Buffer[] = [];
    for await (const c of req) chunks.push(c as Buffer);
    const raw = Buffer.concat(chunks);
    const answer = (status: number, body: unknown) => {
      res.writeHead(status, { "Content-Type": "application/json" });
      res.end(JSON.stringify(body));
    };
    const refuse = (status: number, code: string, message: string) =>
      answer(status, { error: { code, message, retriable: false } });
    if (req.url === "/v1/partitions") {
      return answer(200, { partitions: 1, generation: 1, owners: { 0: { node: "n", url: this.url } },
                           ...(this.limits ? { limits: this.limits } : {}) });
    }
    this.bodies.push(raw.length);
    if (this.maxBody !== null && raw.length > this.maxBody) {
      return refuse(413, "payload_too_large", `request body exceeds the limit of ${this.maxBody} bytes`);
    }
    const records = (JSON.parse(raw.toString()) as { records: Json[] }).records;
    for (const [i, r] of records.entries()) {
      if (!r.queue) return refuse(400, "invalid_name", `records[${i}].queue name must not be empty`);
      const size = Buffer.byteLength((r.value as string | null) ?? "");
      if (size > this.maxRecord) {
        return refuse(413, "record_too_large", `records[${i}] is ${size} bytes; at most ${this.maxRecord}`);
      }
      if (((r.tags ?? []) as string[]).some((t) => t.includes(","))) {
        return refuse(400, "invalid_record", `records[${i}].tags must not hold commas`);
      }
    }
    await new Promise((r) => setTimeout(r, Math.random() * 5));
    answer(200, { results: records.map((r) => {
      this.log.push([r.queue as string, r.value as string]);
      return { queue: r.queue, partition: 0, offset: this.log.length - 1 };
    }) });
  }
}

const LIMITS = { max_body_bytes: 20_000, max_batch_records: 1000, max_record_bytes: 4096 };

function valuesOf(log: Array<[string, string]>, queue: string): string[] {
  return log.filter(([q]) => q === queue).map(([, v]) => v.slice(0, 4));
}

function expected(k: number, total = 100, queues = 10): string[] {
  const out: string[] = [];
  for (let i = k; i < total; i += queues) out.push(String(i).padStart(4, "0"));
  return out;
}

describe("against a fake node", () => {
  let node: FakeNode;
  let vq: Client;

  before(async () => {
    node = await new FakeNode().started();
  });

  after(async () => {
    vq?.close();
    await node.close();
  });

  test("the BatchProducer keeps each request within the body limit the map gives", async () => {
    node.limits = LIMITS;
    node.maxBody = 20_000;
    vq = new Client([node.url]);
    const producer = new BatchProducer(vq, { lingerMs: 50 });
    const offsets = await Promise.all(Array.from({ length: 100 }, (_, i) =>
      producer.send(`p${i % 10}`, String(i).padStart(4, "0") + "x".repeat(996))));
    assert.ok(offsets.every((o) => typeof o === "number"));
    assert.equal(vq.maxBodyBytes, 20_000);
    assert.equal(vq.maxRecordBytes, 4096);
    assert.ok(Math.max(...node.bodies) <= 20_000 && node.bodies.length >= 5, String(node.bodies));
    for (let k = 0; k < 10; k++) assert.deepEqual(valuesOf(node.log, `p${k}`), expected(k));
    vq.close();
  });

  test("before it knows the limit a 413 splits the request and sends it again", async () => {
    node.limits = null;  // a limit the map does not publish (an old node, a proxy)
    node.maxBody = 20_000;
    vq = new Client([node.url]);
    assert.equal(vq.maxBodyBytes, DEFAULT_MAX_BODY_BYTES);
    const producer = new BatchProducer(vq, { lingerMs: 50 });
    const offsets = await Promise.all(Array.from({ length: 100 }, (_, i) =>
      producer.send(`s${i % 10}`, String(i).padStart(4, "0") + "x".repeat(996))));
    assert.ok(offsets.every((o) => typeof o === "number"));
    assert.ok(vq.maxBodyBytes < 20_000);
    vq.maxBodyBytes = DEFAULT_MAX_BODY_BYTES;
    const results = await vq.enqueueMany(Array.from({ length: 100 }, (_, i) =>
      [`m${i % 10}`, String(i).padStart(4, "0") + "y".repeat(996)] as [string, string]));
    assert.deepEqual(results.filter((r) => r.error).map((r) => r.error?.message), []);
    for (let k = 0; k < 10; k++) {
      assert.deepEqual(valuesOf(node.log, `s${k}`), expected(k));
      assert.deepEqual(valuesOf(node.log, `m${k}`), expected(k));
    }
    vq.close();
  });

  test("one bad record in a batch fails alone, named by its queue", async () => {
    node.limits = { ...LIMITS, max_record_bytes: 1024 * KB, max_body_bytes: 4096 * KB };
    node.maxBody = null;
    vq = new Client([node.url]);
    const before = node.log.length;
    const producer = new BatchProducer(vq, { lingerMs: 50 });
    const settle = (p: Promise<number | null>) => p.then((o) => o, (e: VQError) => e);
    const good = Array.from({ length: 20 }, (_, i) => settle(producer.send(`g${i}`, `v${i}`)));
    const tooBig = settle(producer.send("big", "x".repeat(1024 * KB + 1)));
    const unnamed = settle(producer.send("", "v"));
    const control = settle(producer.send("bad\u0007name", "v"));
    const badTag = settle(producer.send("tagged", { value: "v", tags: ["a,b"] }));
    const behind = settle(producer.send("tagged", "w"));  // none overtakes a failed record
    await producer.flush();
    for (const o of await Promise.all(good)) assert.equal(typeof o, "number");
    const big = await tooBig as VQError;
    assert.equal(big.code, "record_too_large");
    assert.match(big.message, /"big"/);
    assert.doesNotMatch(big.message, /records\[/);
    assert.equal((await unnamed as VQError).code, "invalid_name");
    assert.equal((await control as VQError).code, "invalid_name");
    const tag = await badTag as VQError;
    assert.equal(tag.code, "invalid_record");
    assert.equal(tag.status, 400);
    assert.equal(tag.retriable, false);
    assert.match(tag.message, /"tagged"/);
    assert.doesNotMatch(tag.message, /records\[\d+\]/);
    assert.equal((await behind as VQError).code, "invalid_record");
    assert.deepEqual(new Set(node.log.slice(before).map(([q]) => q)),
                     new Set(Array.from({ length: 20 }, (_, i) => `g${i}`)));
    vq.close();
  });

  test("enqueueMany fails only the bad records, naming their place in the list", async () => {
    const items = Array.from({ length: 20 }, (_, i) =>
      [`e${i}`, `v${i}`] as [string, string | { value: string; tags: string[] }]);
    items[5] = ["big", "x".repeat(1024 * KB + 1)];
    items[9] = ["", "v"];
    items[12] = ["tagged", { value: "v", tags: ["a,b"] }];
    vq = new Client([node.url]);
    const before = node.log.length;
    const results = await vq.enqueueMany(items);
    const bad = results.flatMap((r, i) => (r.error ? [[i, r.error] as const] : []));
    assert.deepEqual(bad.map(([i]) => i), [5, 9, 12]);
    assert.deepEqual(bad.map(([, e]) => e.code),
                     ["record_too_large", "invalid_name", "invalid_record"]);
    for (const [i, e] of bad) assert.match(e.message, new RegExp(`records\\[${i}\\]`));
    assert.deepEqual(node.log.slice(before).map(([q]) => q),
                     items.map(([q]) => q).filter((_, i) => ![5, 9, 12].includes(i)));
    vq.close();
  });
});

describe("while no node answers", () => {
  test("calls retry until the deadline, then fail with DeadlineExceededError", async () => {
    const vq = new Client(["http://127.0.0.1:1"], { deadlineMs: 500, backoffInitialMs: 10 });
    try {
      const err = await vq.enqueue("q", "x").then(() => null, (e: VQError) => e);
      assert.ok(err instanceof DeadlineExceededError, String(err));
      assert.equal(err.last?.code, "no_node_reachable");
      const [result] = await vq.enqueueMany([["q", "x"]]);
      assert.equal(result.error?.code, "deadline_exceeded");
      const sent = await new BatchProducer(vq, { lingerMs: 1 }).send("q", "x")
        .then(() => null, (e: VQError) => e);
      assert.equal(sent?.code, "deadline_exceeded");
    } finally {
      vq.close();
    }
  });

  test("a node that starts answering within the deadline gets the records", async () => {
    const probe = await new FakeNode().started();
    const port = (probe.server.address() as AddressInfo).port;
    await probe.close();
    const vq = new Client([`http://127.0.0.1:${port}`], { backoffInitialMs: 10,
                                                          backoffMaxMs: 100 });
    const producer = new BatchProducer(vq, { lingerMs: 1 });
    const calls = Promise.all([vq.enqueueMany([["r", "b"]]), producer.send("s", "c")]);
    await new Promise((r) => setTimeout(r, 300));  // every call has found no node by now
    const node = await new FakeNode(port).started();
    try {
      const [many, offset] = await calls;
      assert.ok(!many[0].error && typeof offset === "number");
      assert.deepEqual(node.log.map(([, v]) => v).sort(), ["b", "c"]);
    } finally {
      vq.close();
      await node.close();
    }
  });
});

describe("against a node with low limits", { timeout: 240_000 }, () => {
  const MAX_BODY = 256 * KB;
  const MAX_RECORD = 64 * KB;
  const run = randomUUID().slice(0, 6);
  let cluster: DevCluster;

  before(async () => {
    cluster = await DevCluster.start(1, 4, { VQ_MAX_BODY_BYTES: String(MAX_BODY),
                                             VQ_MAX_RECORD_BYTES: String(MAX_RECORD) });
  });

  after(async () => {
    await cluster?.stop();
  });

  async function values(url: string, queue: string): Promise<string[]> {
    const body = await (await fetch(`${url}/v1/queues/${queue}/records?limit=1000`)).json() as
      { records: Array<{ value: string }> };
    return body.records.map((r) => r.value);
  }

  test("the client learns the limits from the map and splits on the node's 413", async () => {
    const vq = new Client(cluster.urls, { refreshIntervalMs: 3_600_000 });
    try {
      const map = await vq.clusterMap();
      assert.deepEqual(map.limits, { max_body_bytes: MAX_BODY, max_batch_records: 1000,
                                     max_record_bytes: MAX_RECORD });
      assert.equal(vq.maxBodyBytes, MAX_BODY);
      const value = (i: number) => String(i).padStart(4, "0") + "x".repeat(17_000);
      const producer = new BatchProducer(vq, { lingerMs: 50 });
      const offsets = await Promise.all(Array.from({ length: 100 }, (_, i) =>
        producer.send(`lim-${run}-${i % 10}`, value(i))));
      assert.ok(offsets.every((o) => typeof o === "number"));
      assert.ok(producer.requests >= 7, String(producer.requests));
      vq.maxBodyBytes = DEFAULT_MAX_BODY_BYTES;  // as a client that has not seen the map
      const results = await vq.enqueueMany(Array.from({ length: 100 }, (_, i) =>
        [`lim-${run}-${i % 10}`, value(i)] as [string, string]));
      assert.deepEqual(results.filter((r) => r.error).map((r) => r.error?.message), []);
      assert.ok(vq.maxBodyBytes <= MAX_BODY);
      for (let k = 0; k < 10; k++) {
        const got = (await values(cluster.urls[0], `lim-${run}-${k}`)).map((v) => v.slice(0, 4));
        assert.deepEqual(got, [...expected(k), ...expected(k)]);
      }
    } finally {
      vq.close();
    }
  });

  test("a record the node refuses fails alone; the batch's others are written", async () => {
    const vq = new Client(cluster.urls);
    try {
      const producer = new BatchProducer(vq, { lingerMs: 50 });
      const settle = (p: Promise<number | null>) => p.then((o) => o, (e: VQError) => e);
      const good = Array.from({ length: 20 }, (_, i) => settle(producer.send(`ok-${run}-${i}`, "v")));
      const bad = settle(producer.send(`bad-${run}`, { value: "v", tags: ["a,b"] }));
      await producer.flush();
      for (const o of await Promise.all(good)) assert.equal(typeof o, "number");
      const err = await bad as VQError;
      assert.equal(err.code, "invalid_record");
      assert.equal(err.status, 400);
      assert.match(err.message, new RegExp(`"bad-${run}"`));
      assert.doesNotMatch(err.message, /records\[\d+\]/);
      const results = await vq.enqueueMany([[`ok-${run}-0`, "w"],
                                            [`bad-${run}`, { value: "v", tags: ["a,b"] }],
                                            [`ok-${run}-1`, "w"]]);
      assert.deepEqual(results.map((r) => r.error?.code), [undefined, "invalid_record", undefined]);
      assert.match(results[1].error!.message, /records\[1\]/);
      assert.deepEqual(await values(cluster.urls[0], `ok-${run}-0`), ["v", "w"]);
      assert.deepEqual(await values(cluster.urls[0], `bad-${run}`), []);
    } finally {
      vq.close();
    }
  });
});
