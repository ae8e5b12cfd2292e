import { type Client, type Lease, sleep } from "./client.js";
import { VQError } from "./errors.js";

/** What a Worker runs for each leased record; `signal` aborts on `stop({ finish: false })`. */
export type Handler = (lease: Lease, signal: AbortSignal) => unknown | Promise<unknown>;

export interface WorkerOptions {
  /** Handlers running at once (4). */
  concurrency?: number;
  /** Records leased per call, at most (the free slots, up to this; 100). */
  maxBatch?: number;
  /** How long an idle leaser long-polls, ms (5,000). */
  waitMs?: number;
  /** The lease's visibility, ms (the consumer's own when unset). */
  visibilityMs?: number;
  /** A failed record's first retry delay, ms (1,000): doubled per attempt, with full jitter. */
  backoffInitialMs?: number;
  backoffMaxMs?: number;
  /** A running handler's lease is extended once less than this is left of it, ms (5,000). */
  extendBeforeMs?: number;
  /** Called with errors the worker goes on after (a failed lease call, say). */
  onError?: (err: unknown) => void;
}

/**
 * `new Worker(client, ["jobs"], "pool", handler).start()`: a pool of handlers on a lease
 * consumer (docs/work-queues.md). A leaser per queue leases as many records as there are free
 * slots (long-polling when there are none to lease); each record runs in a slot. A handler
 * that returns has its record completed; one that throws has its record retried after a
 * backoff that grows with its attempt number and the error as the reason (past the consumer's
 * `max_attempts` the node moves it to the dead-letter queue). A lease close to its deadline
 * while its handler runs is extended. `stop()` stops leasing and lets running handlers finish;
 * `stop({ finish: false })` aborts them and gives their records back at once.
 */
export class Worker {
  readonly concurrency: number;
  /** Records handled: completed, and retried after a failure. */
  completed = 0;
  retried = 0;
  private readonly opts: Required<Omit<WorkerOptions, "visibilityMs" | "onError">> &
    Pick<WorkerOptions, "visibilityMs" | "onError">;
  private readonly queues: string[];
  private running = 0;
  private stopping = false;
  private readonly abort = new AbortController();
  private readonly leasers: Promise<void>[] = [];
  private readonly handling = new Set<Promise<void>>();
  private slotFreed: (() => void) | null = null;

  constructor(readonly client: Client, queues: string | string[], readonly consumer: string,
              readonly handler: Handler, options: WorkerOptions = {}) {
    this.queues = typeof queues === "string" ? [queues] : queues;
    this.concurrency = options.concurrency ?? 4;
    this.opts = {
      concurrency: this.concurrency, maxBatch: options.maxBatch ?? 100,
      waitMs: options.waitMs ?? 5_000, visibilityMs: options.visibilityMs,
      backoffInitialMs: options.backoffInitialMs ?? 1_000,
      backoffMaxMs: options.backoffMaxMs ?? 60_000,
      extendBeforeMs: options.extendBeforeMs ?? 5_000, onError: options.onError,
    };
  }

  /** Start leasing; returns the worker. */
  start(): this {
    for (const queue of this.queues) this.leasers.push(this.lease(queue));
    return this;
  }

  /** Stop leasing, then wait for running handlers (`finish`, the default) or abort them and
   * give their records back. */
  async stop(opts: { finish?: boolean } = {}): Promise<void> {
    this.stopping = true;
    if (opts.finish === false) this.abort.abort(new Error("worker stopped"));
    this.slotFreed?.();
    await Promise.allSettled(this.leasers);
    await Promise.allSettled([...this.handling]);
  }

  private async lease(queue: string): Promise<void> {
    let delay = 100;
    while (!this.stopping) {
      const room = this.concurrency - this.running;
      if (room <= 0) {
        await new Promise<void>((resolve) => { this.slotFreed = resolve; });
        continue;
      }
      let leases: Lease[];
      try {
        leases = await this.client.lease(queue, this.consumer, {
          maxRecords: Math.min(room, this.opts.maxBatch), waitMs: this.opts.waitMs,
          visibilityMs: this.opts.visibilityMs, signal: this.abort.signal });
        delay = 100;
      } catch (exc) {
        if (this.stopping) return;
        this.opts.onError?.(exc);
        await sleep(Math.random() * delay).catch(() => undefined);
        delay = Math.min(5_000, delay * 2);
        continue;
      }
      for (const lease of leases) {
        if (this.stopping && !this.abort.signal.aborted) {
          // Leased while stopping: give it back at once for another worker.
          await this.settle(queue, lease, false, 0, "worker stopping");
          continue;
        }
        this.running += 1;
        const task: Promise<void> = this.handle(queue, lease).finally(() => {
          this.running -= 1;
          this.handling.delete(task);
          const freed = this.slotFreed;
          this.slotFreed = null;
          freed?.();
        });
        this.handling.add(task);
      }
    }
  }

  private async handle(queue: string, lease: Lease): Promise<void> {
    let deadline = lease.deadline;
    let timer: NodeJS.Timeout | undefined;
    const extend = () => {
      const wait = Math.max(0, deadline - Date.now() - this.opts.extendBeforeMs);
      timer = setTimeout(async () => {
        try {
          const visibility = this.opts.visibilityMs ??
            Math.max(this.opts.extendBeforeMs * 2, lease.deadline - Date.now() + 1000);
          const out = await this.client.extend(queue, this.consumer, lease, visibility);
          const d = (out.deadline as number | undefined);
          deadline = d ?? Date.now() + visibility;
          extend();
        } catch (exc) {
          this.opts.onError?.(exc);  // expired: the record comes again, to someone
        }
      }, wait);
    };
    extend();
    let ok = true;
    let reason = "";
    try {
      await this.handler(lease, this.abort.signal);
    } catch (exc) {
      ok = false;
      reason = exc instanceof Error ? exc.message : String(exc);
    } finally {
      clearTimeout(timer);
    }
    if (this.abort.signal.aborted) {
      await this.settle(queue, lease, false, 0, "worker stopped");
      return;
    }
    const backoff = Math.min(this.opts.backoffMaxMs,
                             this.opts.backoffInitialMs * 2 ** Math.max(0, lease.attempt - 1));
    await this.settle(queue, lease, ok, Math.round(Math.random() * backoff), reason);
  }

  private async settle(queue: string, lease: Lease, ok: boolean, delayMs: number,
                       reason: string): Promise<void> {
    try {
      if (ok) {
        await this.client.complete(queue, this.consumer, lease);
        this.completed += 1;
      } else {
        await this.client.retry(queue, this.consumer, lease,
                                { delayMs, reason: reason.slice(0, 200) || undefined });
        this.retried += 1;
      }
    } catch (exc) {
      // lease_expired: the record was handed out again meanwhile; nothing to do here.
      if (!(exc instanceof VQError && exc.code === "lease_expired")) this.opts.onError?.(exc);
    }
  }
}
