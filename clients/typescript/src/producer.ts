import {
  type Client, type NewRecord, type Value, encodeForMany, nameError, namedRecord, renamed,
  requestBytes, sleep,
} from "./client.js";
import { DeadlineExceededError, VQError, errorFrom } from "./errors.js";

interface Pending {
  /** The record as sent (`encodeForMany`), and its value's decoded size. */
  data: Buffer;
  valueBytes: number;
  since: number;
  resolve: (offset: number | null) => void;
  reject: (err: VQError) => void;
}

/**
 * `const p = new BatchProducer(client); const offset = await p.send("q", "x"); await p.flush()`.
 *
 * Records sent within `lingerMs` (or until `maxBatch` wait) go to the nodes in one multi-queue
 * request (`POST /v1/records`) per owner node, whatever their queues, each with its own headers;
 * the owners are called in parallel. A request holds at most `maxBatch` records and the node's
 * `max_batch_records`, in at most its `max_body_bytes` (the client's limits, from the cluster
 * map). A queue has at most one request in flight, so records sent A, B, C to one queue get
 * increasing offsets in that order. A record that fails retriably (`wrong_node`: the cluster
 * map is refreshed; a rebalance or replay; a broker error; a lost connection; no node
 * answering) is sent again ahead of its queue's later records, with jittered backoff, until the
 * client's deadline since its `send`. A record that fails for good fails the queue's records
 * sent after it too, so none overtakes a failed one. A bad queue name fails its `send` at once;
 * a value over `max_record_bytes` fails before it is sent; a record a node refuses a whole
 * request for (a 400 or 413 naming it) fails, named by its queue, and the request's other
 * records are sent again; a request refused as too large is split and sent again. The same
 * guarantees as the Python client's.
 */
export class BatchProducer {
  readonly lingerMs: number;
  readonly maxBatch: number;
  /** Multi-queue requests sent. */
  requests = 0;
  private readonly queued = new Map<string, Pending[]>();
  private count = 0;
  private readonly busy = new Set<string>();
  private readonly notBefore = new Map<string, number>();
  private readonly delay = new Map<string, number>();
  private mapDelay: number;
  private timer: NodeJS.Timeout | null = null;
  private readonly sending = new Set<Promise<void>>();
  private refreshing: Promise<void> | null = null;

  constructor(readonly client: Client, opts: { lingerMs?: number; maxBatch?: number } = {}) {
    this.lingerMs = opts.lingerMs ?? 5;
    this.maxBatch = opts.maxBatch ?? 1000;
    this.mapDelay = client.backoffInitialMs;
  }

  private get batch(): number {
    return Math.max(1, Math.min(this.maxBatch, this.client.maxRecordsPerCall));
  }

  /** Send one record; resolves to its offset (null if the node writes with acks=0). */
  send(queue: string, value: Value | NewRecord, headers?: Record<string, string>
       ): Promise<number | null> {
    const bad = nameError(queue);
    if (bad) return Promise.reject(bad);  // never queued: it holds nothing else back
    const record: NewRecord = typeof value === "object" && value !== null &&
      !(value instanceof Uint8Array) ? value : { value, headers };
    const { data, valueBytes } = encodeForMany(queue, record);
    return new Promise((resolve, reject) => {
      const list = this.queued.get(queue) ?? [];
      list.push({ data, valueBytes, since: Date.now(), resolve, reject });
      this.queued.set(queue, list);
      this.count += 1;
      if (this.count >= this.batch) void this.dispatch();
      else this.timer ??= setTimeout(() => void this.dispatch(), this.lingerMs);
    });
  }

  /** Send everything pending and wait for it. */
  async flush(): Promise<void> {
    while (this.queued.size || this.sending.size || this.refreshing) {
      await this.dispatch();
      if (this.sending.size) await Promise.race(this.sending);
      else if (this.refreshing) await this.refreshing;
      else if (this.queued.size) {  // every queue backing off
        const next = Math.min(Date.now() + 50, ...this.notBefore.values());
        await sleep(Math.max(1, next - Date.now()));
      }
    }
  }

  private dispatch(): Promise<void> {
    if (this.timer) {
      clearTimeout(this.timer);
      this.timer = null;
    }
    this.refreshing ??= this.refresh().finally(() => { this.refreshing = null; });
    return this.refreshing.then(() => this.dispatchNow());
  }

  /** Fetch the cluster map if stale; while no node answers, wait with backoff, failing only
   * the records whose deadline passed. */
  private async refresh(): Promise<void> {
    for (;;) {
      try {
        await this.client.freshMap();
        this.mapDelay = this.client.backoffInitialMs;
        return;
      } catch (exc) {
        const err = exc instanceof VQError ? exc :
          new VQError(0, "connection_error", String(exc), {}, true);
        const now = Date.now();
        for (const [queue, pending] of [...this.queued]) {
          if (!err.retriable) this.fail(queue, [], err);
          else if (now - pending[0].since > this.client.deadlineMs) {
            this.fail(queue, [], new DeadlineExceededError(err));
          }
        }
        if (!this.queued.size) return;
        await sleep(Math.random() * this.mapDelay);  // full jitter
        this.mapDelay = Math.min(this.client.backoffMaxMs, this.mapDelay * 2);
      }
    }
  }

  private dispatchNow(): void {
    const now = Date.now();
    const batch = this.batch;
    const bodyLimit = this.client.maxBodyBytes;
    const requests = new Map<string, Array<Array<[string, Pending[]]>>>();
    const sizes = new Map<string, [number, number]>();  // per owner: last request's records, bytes
    let wake: number | undefined;
    for (const [queue, pending] of [...this.queued]) {
      if (this.busy.has(queue)) continue;
      const nb = this.notBefore.get(queue) ?? 0;
      if (nb > now) {
        wake = Math.min(wake ?? nb, nb);
        continue;
      }
      const bad = this.client.sizeError(`the record sent to queue ${JSON.stringify(queue)}`,
                                        pending[0].data, pending[0].valueBytes);
      if (bad) {  // too large to send: it fails, with those behind it
        this.fail(queue, [], bad);
        continue;
      }
      const url = this.client.cachedOwner(queue);
      const chunks = requests.get(url) ?? [[]];
      requests.set(url, chunks);
      let [count, size] = sizes.get(url) ?? [0, 0];
      if (count && (count >= batch || requestBytes([size, pending[0].data.length]) > bodyLimit)) {
        chunks.push([]);
        count = 0;
        size = 0;
      }
      let n = 0;
      while (n < pending.length && count < batch) {
        const p = pending[n];
        if (count && requestBytes([size, p.data.length]) > bodyLimit) break;
        if (this.client.sizeError("", p.data, p.valueBytes)) break;  // fails at its queue's head
        size += p.data.length + (count ? 1 : 0);
        count += 1;
        n += 1;
      }
      const take = pending.splice(0, n);
      if (!pending.length) this.queued.delete(queue);
      this.count -= take.length;
      sizes.set(url, [count, size]);
      chunks[chunks.length - 1].push([queue, take]);
      this.busy.add(queue);
    }
    for (const [url, chunks] of requests) {
      for (const groups of chunks) {
        if (!groups.length) continue;
        const task: Promise<void> = this.sendTo(url, groups).finally(() => {
          this.sending.delete(task);
        });
        this.sending.add(task);
      }
    }
    if (wake !== undefined && this.timer === null) {
      this.timer = setTimeout(() => void this.dispatch(), Math.max(0, wake - now));
    }
  }

  private async sendTo(url: string, groups: Array<[string, Pending[]]>): Promise<void> {
    let refresh = false;
    try {
      this.requests += 1;
      let answers;
      try {
        answers = await this.client.postEncoded(
          url, groups.flatMap(([, ps]) => ps.map((p) => p.data)));
      } catch (exc) {
        const err = exc instanceof VQError ? exc :
          new VQError(0, "connection_error", String(exc), {}, true);
        refresh = this.refused(groups, err);
        return;
      }
      let at = 0;
      for (const [queue, pending] of groups) {
        const mine = answers.slice(at, at + pending.length);
        at += pending.length;
        let ok = true;
        for (let n = 0; n < pending.length; n++) {
          const answer = mine[n];
          if ("error" in answer) {
            const err = errorFrom((answer.status as number | undefined) ?? 0, answer);
            refresh = this.failed(queue, pending.slice(n), BatchProducer.ours(err, groups)) ||
              refresh;
            ok = false;
            break;
          }
          pending[n].resolve((answer.offset as number | null | undefined) ?? null);
        }
        if (ok) {
          this.delay.delete(queue);
          this.notBefore.delete(queue);
        }
      }
    } finally {
      if (refresh) {
        try {
          await this.client.refreshMap();
        } catch {
          // the next dispatch tries again
        }
      }
      for (const [queue] of groups) this.busy.delete(queue);
      if (this.queued.size) void this.dispatch();
    }
  }

  /** `err` naming records by their queue, not by their place in the producer's request. */
  private static ours(err: VQError, groups: Array<[string, Pending[]]>): VQError {
    const queues = groups.flatMap(([queue, ps]) => ps.map(() => queue));
    return renamed(err, (k) => (k >= 0 && k < queues.length ?
      `the record sent to queue ${JSON.stringify(queues[k])}` : "a record"), () => undefined);
  }

  /** A node refused the request of `groups` as a whole (or it was not delivered): send it
   * again, split, or without the one record it names; or fail it. True if the cluster map
   * should be refreshed. */
  private refused(groups: Array<[string, Pending[]]>, err: VQError): boolean {
    if (err.retriable) {
      let refresh = false;
      for (const [queue, pending] of groups) refresh = this.failed(queue, pending, err) || refresh;
      return refresh;
    }
    const total = groups.reduce((n, [, ps]) => n + ps.length, 0);
    let at = namedRecord(err, total);
    if (at === null && total === 1 && err.code === "payload_too_large") at = 0;
    if (at !== null) {  // that record fails (with its queue's later ones); the rest go again
      const mine = BatchProducer.ours(err, groups);
      for (const [queue, pending] of groups) {
        if (at >= 0 && at < pending.length) {
          this.fail(queue, pending.slice(at), mine);
          this.requeue(queue, pending.slice(0, at));
        } else {
          this.requeue(queue, pending);
        }
        at -= pending.length;
      }
      return false;
    }
    if (err.code === "payload_too_large" || err.code === "too_many_records") {
      this.client.learnRefusal(err, groups.flatMap(([, ps]) => ps.map((p) => p.data.length)));
      for (const [queue, pending] of groups) this.requeue(queue, pending);
      return false;
    }
    for (const [queue, pending] of groups) this.fail(queue, pending, err);
    return false;
  }

  /** Put `pending` back at the head of its queue, to go in the next request. */
  private requeue(queue: string, pending: Pending[]): void {
    if (!pending.length) return;
    this.queued.set(queue, [...pending, ...(this.queued.get(queue) ?? [])]);
    this.count += pending.length;
  }

  /** `pending` (the queue's oldest records) failed: put them back at the head of the queue to
   * go again, or fail them and everything after them. True if the map should be refreshed. */
  private failed(queue: string, pending: Pending[], err: VQError): boolean {
    const now = Date.now();
    const retriable = err.retriable || err.code === "wrong_node";
    if (!retriable || now - pending[0].since > this.client.deadlineMs) {
      this.fail(queue, pending, retriable ? new DeadlineExceededError(err) : err);
      return false;
    }
    this.requeue(queue, pending);
    if (err.code !== "wrong_node") {
      const delay = this.delay.get(queue) ?? this.client.backoffInitialMs;
      this.notBefore.set(queue, now + Math.random() * delay);
      this.delay.set(queue, Math.min(this.client.backoffMaxMs, delay * 2));
    }
    return ["wrong_node", "partition_unavailable", "connection_error"].includes(err.code);
  }

  private fail(queue: string, pending: Pending[], err: VQError): void {
    const behind = this.queued.get(queue) ?? [];
    this.queued.delete(queue);
    this.count -= behind.length;
    for (const p of [...pending, ...behind]) p.reject(err);
    this.notBefore.delete(queue);
    this.delay.delete(queue);
  }
}
