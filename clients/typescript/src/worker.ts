import { type Client, type Lease, MAX_RIDING_TOKENS, sleep } from "./client.js";
import { VQError } from "./errors.js";

/** A handled record whose completion the node refused: `code` is `lease_expired` (its lease
 * was not current any more: the record comes again, to this worker or another),
 * `invalid_token`, or `wrong_node` (prefix: the node does not serve the queue, and its owner
 * refused it too). */
export interface RefusedCompletion {
  lease: Lease;
  queue: string;
  token: string;
  code: string;
}

/** What a Worker runs for each leased record; `signal` aborts on `stop({ finish: false })`. */
export type Handler = (lease: Lease, signal: AbortSignal) => unknown | Promise<unknown>;

export interface WorkerOptions {
  /** Handlers running at once (4). */
  concurrency?: number;
  /** Records leased per call, at most (the free slots, up to this), and completed per
   * standalone complete (100); a lease carries up to 10,000 tokens. */
  maxBatch?: number;
  /** How long a handled record's token waits for the next lease to carry it, ms (50): when
   * no lease of its queue (node, for a prefix worker) goes out within it, a standalone
   * complete sends it with the others waiting. */
  completeDelayMs?: number;
  /** Records leased ahead of the slots, at most. By default it follows the handlers: what
   * the slots handle in two lease round trips, up to 30 per slot, and none for slow ones. */
  prefetch?: number;
  /** How long an idle leaser long-polls, ms (5,000). */
  waitMs?: number;
  /** The lease's visibility, ms (the consumer's own when unset). */
  visibilityMs?: number;
  /** A failed record's first retry delay, ms (1,000): doubled per attempt, with full jitter. */
  backoffInitialMs?: number;
  backoffMaxMs?: number;
  /** A lease not yet settled (its handler running, or leased ahead and waiting for a slot)
   * is extended once less than this is left of it, ms (5,000). */
  extendBeforeMs?: number;
  /** Called with errors the worker goes on after (a failed lease call, say). */
  onError?: (err: unknown) => void;
  /** Called for each handled record whose completion the node refused (its record comes
   * again). Without it, each is logged with `console.warn`. */
  onRefused?: (refused: RefusedCompletion) => void;
  /** Lease from the prefix consumer named `consumer` (give no queues): a leaser per node of
   * the cluster map, each settling with its node. */
  prefix?: boolean;
  /** (prefix) How often the map is looked at for nodes that came or went, ms (5,000). */
  mapRefreshMs?: number;
}

/** Where records come from and go back to: a queue, or one node of a prefix consumer. */
interface Source {
  name: string;
  /** Lease, completing `complete` (leases of this source) first: the leases granted, and
   * the completed and refused ones among `complete`. */
  lease(maxRecords: number, waitMs: number, visibilityMs: number | undefined,
        signal: AbortSignal, complete: Lease[]): Promise<Leased>;
  complete(leases: Lease[]): Promise<unknown>;
  /** The queue a lease of this source is from. */
  queueOf(lease: Lease): string;
  /** The leases a `lease_expired` refusal names as stale. */
  stale(exc: VQError, leases: Lease[]): Set<Lease>;
  retry(lease: Lease, delayMs: number, reason: string | undefined): Promise<unknown>;
  /** Extend the leases, all or nothing: each one's new deadline, where the node said. */
  extend(leases: Lease[], visibilityMs: number): Promise<Map<Lease, number>>;
}

interface Leased {
  leases: Lease[];
  completed: number;
  refused: Array<[Lease, string]>;
}

function queueSource(client: Client, queue: string, consumer: string): Source {
  return {
    name: queue,
    lease: async (n, waitMs, visibilityMs, signal, complete) => {
      const out = await client.lease(queue, consumer, { maxRecords: n, waitMs, visibilityMs,
                                                        signal, complete });
      const byToken = new Map(complete.map((l) => [l.token, l]));
      return { leases: out, completed: out.completed.length,
               refused: out.refused.flatMap((r): Array<[Lease, string]> => {
                 const lease = byToken.get(r.token);
                 return lease ? [[lease, r.code]] : [];
               }) };
    },
    complete: (leases) => client.complete(queue, consumer, leases),
    queueOf: () => queue,
    stale: (exc, leases) => {
      const names = new Set((exc.details.stale as unknown[] | undefined ?? []).map(String));
      return new Set(leases.filter((l) => names.has(l.token)));
    },
    retry: (lease, delayMs, reason) => client.retry(queue, consumer, lease, { delayMs, reason }),
    extend: async (leases, v) => {
      const deadline = (await client.extend(queue, consumer, leases, v)).deadline;
      return new Map(deadline ? leases.map((l) => [l, deadline]) : []);
    },
  };
}

function nodeSource(client: Client, node: string, consumer: string): Source {
  return {
    name: `${consumer}@${node}`,
    lease: async (n, waitMs, visibilityMs, signal, complete) => {
      const out = await client.leasePrefix(consumer, node, { maxRecords: n, waitMs,
                                                             visibilityMs, signal, complete });
      const byPair = new Map(complete.map((l) => [`${l.queue}\u0000${l.token}`, l]));
      return { leases: out, completed: out.completed.length,
               refused: out.refused.flatMap((r): Array<[Lease, string]> => {
                 const lease = byPair.get(`${r.queue}\u0000${r.token}`);
                 return lease ? [[lease, r.code]] : [];
               }) };
    },
    complete: (leases) => client.completePrefix(consumer, node, leases),
    queueOf: (lease) => lease.queue ?? "",
    stale: (exc, leases) => {
      const pairs = (exc.details.stale as Array<{ queue?: string; token?: string }> | undefined
        ?? []).map((x) => `${x.queue}\u0000${x.token}`);
      const names = new Set(pairs);
      return new Set(leases.filter((l) => names.has(`${l.queue}\u0000${l.token}`)));
    },
    retry: (lease, delayMs, reason) => client.retryPrefix(consumer, node, [lease],
                                                          { delayMs, reason }),
    extend: async (leases, v) => {
      const out = await client.extendPrefix(consumer, node, leases, v);
      const byQueue = new Map(
        (out.queues as Array<{ queue: string; deadline?: number | null }> | undefined ?? [])
          .map((r) => [r.queue, r.deadline ?? undefined]));
      const deadlines = new Map<Lease, number>();
      for (const l of leases) {
        const d = byQueue.get(l.queue ?? "");
        if (d) deadlines.set(l, d);
      }
      return deadlines;
    },
  };
}

/**
 * `new Worker(client, ["jobs"], "pool", handler).start()`: a pool of handlers on a lease
 * consumer (docs/work-queues.md). A leaser per queue leases as many records as there are free
 * slots and room ahead of them (`prefetch`; long-polling when there are none to lease); each
 * record runs in a slot, in lease order. Without an explicit `prefetch` the room ahead is what
 * the slots handle in two lease round trips (both measured as it runs), up to 30 per slot:
 * none for slow handlers, whose records would wait. A handler that returns has its record
 * completed by the next lease of its queue (of its node, for a prefix worker), which carries
 * the tokens finished since the last one: one HTTP call per cycle for a busy worker. A token
 * no lease carries within `completeDelayMs` (the leaser long-polls an empty queue, or waits
 * for a free slot) goes in a standalone complete with the others waiting. A failed lease
 * call's tokens are sent again (completing is idempotent). A completion the node refuses
 * (its record comes again) goes to `onRefused`, token by token (else `console.warn`); for a
 * prefix worker, a `wrong_node` refusal (the queue moved) is completed with the queue's owner
 * through `client.complete`, and reported only if that refuses it too. One that throws has its record retried after a
 * backoff that grows with its attempt number and the error as the reason (past the consumer's
 * `max_attempts` the node moves it to the dead-letter queue). A lease close to its deadline
 * (its handler slow, or the record still waiting for a slot) is extended, in one call per
 * queue (per node for a prefix worker). `stop()` stops leasing, lets
 * running handlers finish and completes what they finished; `stop({ finish: false })` aborts
 * them and gives their records back at once.
 */
export class Worker {
  readonly concurrency: number;
  /** Records handled: completed, and retried after a failure. */
  completed = 0;
  retried = 0;
  private readonly opts: Required<Omit<WorkerOptions,
                                       "visibilityMs" | "onError" | "onRefused" | "prefetch">> &
    Pick<WorkerOptions, "visibilityMs" | "onError" | "onRefused">;
  private readonly nodes = new Map<string, Promise<void>>();  // (prefix) a leaser per node
  private readonly queues: string[];
  private running = 0;
  private reserved = 0;  // slots held by lease calls in flight (several leasers share them)
  private stopping = false;
  private readonly abort = new AbortController();  // stop({ finish: false }): handlers too
  private readonly halt = new AbortController();  // any stop: the map's next look
  private readonly leasers: Promise<void>[] = [];
  private readonly handling = new Set<Promise<void>>();
  private waiting: Array<() => void> = [];  // leasers waiting for a free slot
  // Handled, waiting for the source's next lease to carry them, or the flush timer.
  private readonly done = new Map<Source, Lease[]>();
  /** Sources whose node takes no completions on a lease (older than ADR 16). */
  private readonly noRiding = new Set<Source>();
  private readonly timers = new Map<Source, NodeJS.Timeout>();  // each source's flush
  private readonly flushing = new Set<Promise<void>>();
  private readonly buffer: Array<[Source, Lease]> = [];  // leased ahead, for the next free slot
  private ahead: number;  // room for records leased ahead of the slots
  private readonly adaptive: boolean;
  private handlerMs = 0;  // moving averages: a handler's run, a lease call's round trip
  private leaseMs = 0;
  // Leases not settled yet (buffered or running): their source, deadline and granted span.
  private readonly unsettled = new Map<Lease, { source: Source; deadline: number;
                                                span: number }>();
  private keeper?: NodeJS.Timeout;
  private extending = false;

  constructor(readonly client: Client, queues: string | string[] | null, readonly consumer: string,
              readonly handler: Handler, options: WorkerOptions = {}) {
    this.queues = queues === null ? [] : typeof queues === "string" ? [queues] : queues;
    if (options.prefix && this.queues.length) {
      throw new TypeError("a prefix Worker leases from the prefix consumer: give no queues");
    }
    if (!options.prefix && !this.queues.length) {
      throw new TypeError("a Worker needs at least one queue (or prefix: true)");
    }
    this.concurrency = options.concurrency ?? 4;
    this.adaptive = options.prefetch === undefined;
    this.ahead = Math.max(0, options.prefetch ?? 0);
    this.opts = {
      concurrency: this.concurrency, maxBatch: options.maxBatch ?? 100,
      completeDelayMs: options.completeDelayMs ?? 50,
      waitMs: options.waitMs ?? 5_000, visibilityMs: options.visibilityMs,
      backoffInitialMs: options.backoffInitialMs ?? 1_000,
      backoffMaxMs: options.backoffMaxMs ?? 60_000,
      extendBeforeMs: options.extendBeforeMs ?? 5_000, onError: options.onError,
      onRefused: options.onRefused,
      prefix: options.prefix ?? false, mapRefreshMs: options.mapRefreshMs ?? 5_000,
    };
  }

  /** Start leasing; returns the worker. */
  start(): this {
    // Often enough that a due lease is extended with most of `extendBeforeMs` left.
    const period = Math.max(50, Math.min(1_000, this.opts.extendBeforeMs / 5));
    this.keeper = setInterval(() => { void this.extendDue(); }, period);
    if (this.opts.prefix) {
      this.leasers.push(this.followNodes());
    } else {
      for (const queue of this.queues) {
        this.leasers.push(this.lease(queueSource(this.client, queue, this.consumer)));
      }
    }
    return this;
  }

  /** (prefix) A leaser for each node in the cluster map, as nodes come and go. */
  private async followNodes(): Promise<void> {
    while (!this.stopping) {
      try {
        const urls = await this.client.nodeUrls();
        for (const url of urls) {
          if (this.nodes.has(url)) continue;
          let started!: () => void;
          const ready = new Promise<void>((resolve) => { started = resolve; });
          // Registered before it runs: its loop asks whether its node is still in the map.
          this.nodes.set(url, ready.then(() => this.lease(
            nodeSource(this.client, url, this.consumer),
            () => [...this.client.owners.values()].includes(url)))
            .finally(() => this.nodes.delete(url)));
          started();
        }
      } catch (exc) {
        this.opts.onError?.(exc);
      }
      await sleep(this.opts.mapRefreshMs, this.halt.signal).catch(() => undefined);
    }
    await Promise.allSettled([...this.nodes.values()]);
  }

  /** Stop leasing, then wait for running handlers (`finish`, the default) or abort them and
   * give their records back. */
  async stop(opts: { finish?: boolean } = {}): Promise<void> {
    this.stopping = true;
    this.halt.abort();
    if (opts.finish === false) this.abort.abort(new Error("worker stopped"));
    this.wakeLeasers();
    await Promise.allSettled(this.leasers);
    // Leased ahead and not started: back at once for another worker.
    for (const [source, lease] of this.buffer.splice(0)) {
      this.unsettled.delete(lease);
      await this.giveBack(source, lease, 0, "worker stopping");
    }
    await Promise.allSettled([...this.handling]);
    clearInterval(this.keeper);
    for (const source of [...this.done.keys()]) this.flush(source);
    while (this.flushing.size) await Promise.allSettled([...this.flushing]);
  }

  private async lease(source: Source, current: () => boolean = () => true): Promise<void> {
    let delay = 100;
    // A source that had nothing long-polls with one slot, so that it holds no room another
    // source could use.
    let idle = false;
    while (!this.stopping && current()) {
      const room = this.concurrency + this.ahead - this.running - this.reserved -
        this.buffer.length;
      if (room <= 0) {
        await new Promise<void>((resolve) => { this.waiting.push(resolve); });
        continue;
      }
      const wanted = idle ? 1 : Math.min(room, this.opts.maxBatch);
      this.reserved += wanted;
      let leases: Lease[];
      const started = performance.now();
      const riding = this.take(source);
      try {
        const out = await source.lease(wanted, this.opts.waitMs, this.opts.visibilityMs,
                                       this.abort.signal, riding);
        leases = out.leases;
        this.completed += out.completed;
        this.refused(source, out.refused);
        delay = 100;
        if (!idle && leases.length) {  // a long poll's time is the wait, not the round trip
          this.leaseMs = average(this.leaseMs, performance.now() - started);
          this.adapt();
        }
        idle = leases.length === 0;
      } catch (exc) {
        this.putBack(source, riding);  // maybe completed already: sent again, harmlessly
        if (this.stopping) return;
        if (riding.length && exc instanceof VQError && exc.code === "invalid_parameter" &&
            Array.isArray(exc.details.unknown) && exc.details.unknown.includes("complete")) {
          // A node from before completions rode on leases (a rolling upgrade): complete
          // alone there, as Workers did then.
          this.noRiding.add(source);
          continue;
        }
        this.opts.onError?.(exc);
        if (this.opts.prefix && exc instanceof VQError &&
            (exc.code === "wrong_node" || exc.status === 0)) {
          return;  // the node is gone or moved: the map's next look starts what follows
        }
        await sleep(Math.random() * delay).catch(() => undefined);
        delay = Math.min(5_000, delay * 2);
        continue;
      } finally {
        this.reserved -= wanted;
        this.wakeLeasers();
      }
      for (const lease of leases) {
        if (this.stopping && !this.abort.signal.aborted) {
          // Leased while stopping: give it back at once for another worker.
          await this.giveBack(source, lease, 0, "worker stopping");
          continue;
        }
        this.unsettled.set(lease, { source, deadline: lease.deadline,
                                    span: Math.max(0, lease.deadline - Date.now()) });
        this.buffer.push([source, lease]);
      }
      this.dispatch();
    }
  }

  /** Start the records leased ahead in the free slots, oldest first. */
  private dispatch(): void {
    while (this.running < this.concurrency && this.buffer.length) {
      const [source, lease] = this.buffer.shift()!;
      this.running += 1;
      const task: Promise<void> = this.handle(source, lease).finally(() => {
        this.running -= 1;
        this.handling.delete(task);
        if (!this.stopping) this.dispatch();
        this.wakeLeasers();
      });
      this.handling.add(task);
    }
  }

  /** Lease ahead what the slots handle in two lease round trips, up to 30 per slot (only
   * without an explicit `prefetch`). */
  private adapt(): void {
    if (!this.adaptive || this.handlerMs <= 0) return;
    const wanted = Math.floor(2 * this.concurrency * this.leaseMs / this.handlerMs);
    const ahead = Math.min(30 * this.concurrency, wanted);
    if (ahead > this.ahead) this.wakeLeasers();
    this.ahead = ahead;
  }

  private wakeLeasers(): void {
    const waiting = this.waiting;
    this.waiting = [];
    for (const wake of waiting) wake();
  }

  /** Extend the unsettled leases with less than `extendBeforeMs` left: one call per source,
   * each for the lease's own visibility (at least twice `extendBeforeMs`). */
  private async extendDue(): Promise<void> {
    if (this.extending) return;
    this.extending = true;
    try {
      const soon = Date.now() + this.opts.extendBeforeMs;
      const due = new Map<Source, Lease[]>();
      for (const [lease, held] of this.unsettled) {
        if (held.deadline >= soon) continue;
        const leases = due.get(held.source);
        if (leases) leases.push(lease); else due.set(held.source, [lease]);
      }
      for (const [source, leases] of due) await this.extendAll(source, leases);
    } finally {
      this.extending = false;
    }
  }

  private async extendAll(source: Source, leases: Lease[]): Promise<void> {
    const visibility = this.opts.visibilityMs ?? leases.reduce(
      (most, l) => Math.max(most, this.unsettled.get(l)?.span ?? 0), this.opts.extendBeforeMs * 2);
    while (leases.length) {
      try {
        const sent = Date.now();
        const deadlines = await source.extend(leases, visibility);
        for (const l of leases) {
          const held = this.unsettled.get(l);
          if (held) held.deadline = deadlines.get(l) ?? sent + visibility;
        }
        return;
      } catch (exc) {
        this.opts.onError?.(exc);
        const stale = exc instanceof VQError && exc.code === "lease_expired"
          ? source.stale(exc, leases) : new Set<Lease>();
        if (!stale.size) return;  // tried again at the next look
        // Expired and leased again: the record comes again, to someone; nothing to keep.
        for (const l of stale) this.unsettled.delete(l);
        leases = leases.filter((l) => !stale.has(l));
      }
    }
  }

  private async handle(source: Source, lease: Lease): Promise<void> {
    let ok = true;
    let reason = "";
    const started = performance.now();
    try {
      await this.handler(lease, this.abort.signal);
    } catch (exc) {
      ok = false;
      reason = exc instanceof Error ? exc.message : String(exc);
    } finally {
      this.unsettled.delete(lease);
      // (at least 1 µs: a no-op handler can take less than the clock's step)
      this.handlerMs = average(this.handlerMs, Math.max(0.001, performance.now() - started));
    }
    if (this.abort.signal.aborted) {
      await this.giveBack(source, lease, 0, "worker stopped");
      return;
    }
    if (ok) {
      this.toComplete(source, lease);
      return;
    }
    const backoff = Math.min(this.opts.backoffMaxMs,
                             this.opts.backoffInitialMs * 2 ** Math.max(0, lease.attempt - 1));
    await this.giveBack(source, lease, Math.round(Math.random() * backoff), reason);
  }

  /** Keep `lease` for the source's next lease to carry (or the flush `completeDelayMs`
   * later). */
  private toComplete(source: Source, lease: Lease): void {
    this.putBack(source, [lease]);
  }

  /** The source's waiting tokens (at most a lease's worth), for its lease to carry. */
  private take(source: Source): Lease[] {
    if (this.noRiding.has(source)) return [];
    const pending = this.done.get(source);
    if (pending === undefined) return [];
    const riding = pending.splice(0, MAX_RIDING_TOKENS);
    if (!pending.length) {
      this.done.delete(source);
      clearTimeout(this.timers.get(source));
      this.timers.delete(source);
    }
    return riding;
  }

  /** Tokens to complete with the source's next lease, or a standalone complete
   * `completeDelayMs` from now, whichever comes first. */
  private putBack(source: Source, leases: Lease[]): void {
    if (!leases.length) return;
    let pending = this.done.get(source);
    if (pending === undefined) {
      pending = [];
      this.done.set(source, pending);
    }
    pending.push(...leases);
    if (!this.timers.has(source)) {
      this.timers.set(source, setTimeout(() => this.flush(source), this.opts.completeDelayMs));
    }
    if (pending.length >= MAX_RIDING_TOKENS) this.flush(source);
  }

  /** What a lease's `complete` refused: reported, or (`wrong_node`, a prefix worker's queue
   * that moved) completed with the queue's owner. */
  private refused(source: Source, refused: Array<[Lease, string]>): void {
    const moved: Lease[] = [];
    for (const [lease, code] of refused) {
      if (code === "wrong_node") moved.push(lease); else this.report(source, lease, code);
    }
    if (moved.length) this.track(this.completeWithOwners(source, moved));
  }

  private report(source: Source, lease: Lease, code: string): void {
    const refused = { lease, queue: source.queueOf(lease), token: lease.token, code };
    if (this.opts.onRefused) {
      try {
        this.opts.onRefused(refused);
      } catch (exc) {
        this.opts.onError?.(exc);
      }
    } else {
      console.warn(`vqueues Worker: the completion of ${refused.queue} token ${refused.token} ` +
                   `was refused (${code}); the record comes again`);
    }
  }

  private track(task: Promise<void>): void {
    const tracked: Promise<void> = task.finally(() => this.flushing.delete(tracked));
    this.flushing.add(tracked);
  }

  /** Send the source's waiting tokens in standalone completes of at most `maxBatch`. */
  private flush(source: Source): void {
    const batch = this.done.get(source);
    this.done.delete(source);
    clearTimeout(this.timers.get(source));
    this.timers.delete(source);
    if (batch === undefined) return;
    for (let i = 0; i < batch.length; i += this.opts.maxBatch) {
      const chunk = batch.slice(i, i + this.opts.maxBatch);
      this.track(this.completeAll(source, chunk, (ls) => source.complete(ls),
                                  (exc, ls) => source.stale(exc, ls), this.opts.prefix));
    }
  }

  /** Complete `leases` through `send`, all or nothing: a stale token (leased again since) is
   * reported and the rest sent again. With `moveOn`, a node that does not serve the queues
   * any more (`wrong_node`, or gone) has them completed with their owners instead. */
  private async completeAll(source: Source, leases: Lease[],
                            send: (leases: Lease[]) => Promise<unknown>,
                            stale: (exc: VQError, leases: Lease[]) => Set<Lease>,
                            moveOn: boolean): Promise<void> {
    while (leases.length) {
      try {
        await send(leases);
        this.completed += leases.length;
        return;
      } catch (exc) {
        if (moveOn && exc instanceof VQError && (exc.code === "wrong_node" || exc.status === 0)) {
          return await this.completeWithOwners(source, leases);
        }
        const found = exc instanceof VQError && exc.code === "lease_expired"
          ? stale(exc, leases) : new Set<Lease>();
        if (!found.size) {
          this.opts.onError?.(exc);
          return;
        }
        for (const lease of found) this.report(source, lease, "lease_expired");
        leases = leases.filter((l) => !found.has(l));
      }
    }
  }

  /** (prefix) Complete leases with their queues' owners, one per-queue call per queue (the
   * client routes it and follows `wrong_node`). */
  private async completeWithOwners(source: Source, leases: Lease[]): Promise<void> {
    const byQueue = new Map<string, Lease[]>();
    for (const lease of leases) {
      const queue = source.queueOf(lease);
      const list = byQueue.get(queue);
      if (list) list.push(lease); else byQueue.set(queue, [lease]);
    }
    await Promise.all([...byQueue].map(([queue, list]) => this.completeAll(
      source, list, (ls) => this.client.complete(queue, this.consumer, ls),
      (exc, ls) => {
        const names = new Set((exc.details.stale as unknown[] | undefined ?? []).map(String));
        return new Set(ls.filter((l) => names.has(l.token)));
      }, false)));
  }

  /** Give a record back, available again after `delayMs` (a failure's backoff, or at once
   * when stopping). */
  private async giveBack(source: Source, lease: Lease, delayMs: number,
                         reason: string): Promise<void> {
    try {
      await source.retry(lease, delayMs, reason.slice(0, 200) || undefined);
      this.retried += 1;
    } catch (exc) {
      // lease_expired: the record was handed out again meanwhile; nothing to do here.
      if (!(exc instanceof VQError && exc.code === "lease_expired")) this.opts.onError?.(exc);
    }
  }
}

/** An exponential moving average (the first sample starts it). */
function average(mean: number, sample: number): number {
  return mean <= 0 ? sample : mean + 0.2 * (sample - mean);
}
