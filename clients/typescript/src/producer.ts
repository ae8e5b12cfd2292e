import { type Client, type NewRecord, type Value, encodeRecord, sleep } from "./client.js";
import { DeadlineExceededError, type VQError, errorFrom } from "./errors.js";

interface Pending {
  record: NewRecord;
  since: number;
  resolve: (offset: number | null) => void;
  reject: (err: VQError) => void;
}

/**
 * `const p = new BatchProducer(client); const offset = await p.send("q", "x"); await p.flush()`.
 *
 * Records sent within `lingerMs` (or until `maxBatch` wait) go to the nodes in one multi-queue
 * request (`POST /v1/records`) per owner node, whatever their queues, each with its own headers;
 * the owners are called in parallel. A queue has at most one request in flight, so records sent
 * A, B, C to one queue get increasing offsets in that order. A record that fails retriably
 * (`wrong_node`: the cluster map is refreshed; a rebalance or replay; a broker error; a lost
 * connection) is sent again ahead of its queue's later records, with jittered backoff, until
 * the client's deadline since its `send`. A record that fails for good fails the queue's records
 * sent after it too, so none overtakes a failed one. The same guarantees as the Python client's.
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
  private timer: NodeJS.Timeout | null = null;
  private readonly sending = new Set<Promise<void>>();

  constructor(readonly client: Client, opts: { lingerMs?: number; maxBatch?: number } = {}) {
    this.lingerMs = opts.lingerMs ?? 5;
    this.maxBatch = Math.min(opts.maxBatch ?? 1000, client.maxRecordsPerCall);
  }

  /** Send one record; resolves to its offset (null if the node writes with acks=0). */
  send(queue: string, value: Value | NewRecord, headers?: Record<string, string>
       ): Promise<number | null> {
    const record: NewRecord = typeof value === "object" && value !== null &&
      !(value instanceof Uint8Array) ? value : { value, headers };
    return new Promise((resolve, reject) => {
      const list = this.queued.get(queue) ?? [];
      list.push({ record, since: Date.now(), resolve, reject });
      this.queued.set(queue, list);
      this.count += 1;
      if (this.count >= this.maxBatch) void this.dispatch();
      else this.timer ??= setTimeout(() => void this.dispatch(), this.lingerMs);
    });
  }

  /** Send everything pending and wait for it. */
  async flush(): Promise<void> {
    while (this.queued.size || this.sending.size) {
      await this.dispatch();
      if (this.sending.size) await Promise.race(this.sending);
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
    return this.client.freshMap().then(() => this.dispatchNow(), (err: VQError) => {
      for (const queue of [...this.queued.keys()]) this.fail(queue, [], err);
    });
  }

  private dispatchNow(): void {
    const now = Date.now();
    const requests = new Map<string, Array<Array<[string, Pending[]]>>>();
    const sizes = new Map<string, number>();
    let wake: number | undefined;
    for (const [queue, pending] of [...this.queued]) {
      if (this.busy.has(queue)) continue;
      const nb = this.notBefore.get(queue) ?? 0;
      if (nb > now) {
        wake = Math.min(wake ?? nb, nb);
        continue;
      }
      const url = this.client.cachedOwner(queue);
      const chunks = requests.get(url) ?? [[]];
      requests.set(url, chunks);
      if ((sizes.get(url) ?? 0) >= this.maxBatch) {
        chunks.push([]);
        sizes.set(url, 0);
      }
      const take = pending.splice(0, this.maxBatch - (sizes.get(url) ?? 0));
      if (!pending.length) this.queued.delete(queue);
      this.count -= take.length;
      sizes.set(url, (sizes.get(url) ?? 0) + take.length);
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
      const items = groups.flatMap(([queue, ps]) =>
        ps.map((p) => ({ queue, ...encodeRecord(p.record) })));
      this.requests += 1;
      let answers;
      try {
        answers = await this.client.postRecords(url, items);
      } catch (exc) {
        for (const [queue, pending] of groups) {
          refresh = this.failed(queue, pending, exc as VQError) || refresh;
        }
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
            refresh = this.failed(queue, pending.slice(n), err) || refresh;
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

  /** `pending` (the queue's oldest records) failed: put them back at the head of the queue to
   * go again, or fail them and everything after them. True if the map should be refreshed. */
  private failed(queue: string, pending: Pending[], err: VQError): boolean {
    const now = Date.now();
    const retriable = err.retriable || err.code === "wrong_node";
    if (!retriable || now - pending[0].since > this.client.deadlineMs) {
      this.fail(queue, pending, retriable ? new DeadlineExceededError(err) : err);
      return false;
    }
    this.queued.set(queue, [...pending, ...(this.queued.get(queue) ?? [])]);
    this.count += pending.length;
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
