import {
  DeadlineExceededError, VQError, errorFrom,
} from "./errors.js";
import { Transport } from "./http.js";
import { partitionFor } from "./murmur2.js";
import { Stream, type StreamOptions } from "./stream.js";
import type {
  AckResult, ConsumerDeletion, ConsumerSettingsInfo, PartitionsInfo, PrefixRefusedToken,
  PrefixToken, QueueDeletion, QueueInfo, RefusedToken, ScheduledCancellation, SettleResult,
} from "./types.js";

/** A record's value: text (sent as UTF-8), bytes (sent base64), or null. */
export type Value = string | Uint8Array | null;

/** One record to enqueue, with what it carries besides its value. */
export interface NewRecord {
  value: Value;
  headers?: Record<string, string>;
  /** A repeat within the server's window (10 minutes) writes nothing. */
  idempotencyKey?: string;
  /** Indexed by the server: read, lease and stream by tag. */
  tags?: string[];
  /** UTC epoch ms: invisible until then. */
  deliverAt?: number;
  /** Invisible for this long. */
  delayMs?: number;
}

/** A record as a read or a lease returns it. */
export class QueueRecord {
  constructor(readonly offset: number, readonly timestamp: number,
              readonly value: Uint8Array | null, readonly headers: Record<string, string>) {}

  /** The value as UTF-8 text (null for a null value). */
  get text(): string | null {
    return this.value === null ? null : Buffer.from(this.value).toString("utf8");
  }
}

/** A leased record: complete, retry or extend it by `token` before `deadline`. A prefix lease
 * says which `queue` (and `partition`) each record came from. */
export class Lease {
  constructor(readonly record: QueueRecord, readonly token: string, readonly attempt: number,
              readonly deadline: number, readonly queue?: string,
              readonly partition?: number) {}

  get offset(): number { return this.record.offset; }
  get value(): Uint8Array | null { return this.record.value; }
  get headers(): Record<string, string> { return this.record.headers; }
  get text(): string | null { return this.record.text; }
}

export interface EnqueueResult { partition: number; offsets: number[] | null }
export interface ReadResult { partition: number; records: QueueRecord[]; nextOffset: number }

/** One record of a multi-queue enqueue: where it was written, or why it was not. */
export interface RecordResult {
  queue: string;
  partition: number;
  /** null: failed (see `error`), or the node writes with acks=0. */
  offset: number | null;
  error?: VQError;
}

export interface ClientOptions {
  /** A bearer token, sent on every call (nodes run with auth on). */
  token?: string;
  /** A PEM bundle that signed the nodes' certificates (https:// URLs, a private CA). */
  ca?: string | Buffer | Array<string | Buffer>;
  /** How long a call retries retriable failures, ms (30,000). */
  deadlineMs?: number;
  /** The longest one request may take, ms (60,000). */
  requestTimeoutMs?: number;
  /** How old the cached cluster map may get, ms (30,000). */
  refreshIntervalMs?: number;
  backoffInitialMs?: number;
  backoffMaxMs?: number;
}

export interface CallOptions {
  signal?: AbortSignal;
  /** Overrides the client's deadline for this call, ms. */
  deadlineMs?: number;
}

export interface EnqueueOptions extends CallOptions {
  /** For plain values: the headers of each. */
  headers?: Record<string, string>;
  /** For one plain value: */
  idempotencyKey?: string;
  tags?: string[];
  deliverAt?: number;
  delayMs?: number;
}

export interface ReadOptions extends CallOptions {
  consumer?: string;
  offset?: number;
  limit?: number;
  waitMs?: number;
  tag?: string;
}

export interface LeaseOptions extends CallOptions {
  maxRecords?: number;
  visibilityMs?: number;
  waitMs?: number;
  tag?: string;
  /** Tokens (or leases) to complete first, token by token, in the same write as the grants
   * (at most 10,000): the answer's `completed` and `refused` say what each did. */
  complete?: Tokens;
}

/** `leasePrefix`'s options: `complete` takes the prefix lease's leases, or `{queue, token}`
 * pairs, all leased from the node the call goes to. */
export interface PrefixLeaseOptions extends Omit<LeaseOptions, "tag" | "complete"> {
  complete?: Array<Lease | PrefixToken>;
}

/** What `lease` answers: the leased records (an array, as before) and what became of the
 * tokens its `complete` carried: `completed` (done, or found done already) and `refused`
 * (each with its `code`); both empty when it carried none. The two are not enumerable: the
 * array compares, spreads and prints as the records alone. */
export type LeaseBatch = Lease[] & { readonly completed: string[];
                                     readonly refused: RefusedToken[] };

/** What `leasePrefix` answers: as `LeaseBatch`, its tokens `{queue, token}` pairs. */
export type PrefixLeaseBatch = Lease[] & { readonly completed: PrefixToken[];
                                           readonly refused: PrefixRefusedToken[] };

/** The most tokens one lease's `complete` may carry (the node's fixed limit). */
export const MAX_RIDING_TOKENS = 10_000;

export interface ConsumerSettings {
  mode?: "cursor" | "lease";
  maxAttempts?: number;
  /** A queue name; null removes the dead-letter queue. */
  deadLetterQueue?: string | null;
  visibilityMs?: number;
  /** Records leased at once, at most; null: no cap. */
  maxInFlight?: number | null;
  /** Leases answered only once their grants are written (false, the default: written
   * behind the answer; docs/work-queues.md, "What survives a failover"). */
  durableGrants?: boolean;
}

export type Tokens = Lease | string | Array<Lease | string>;
type Json = Record<string, unknown>;

function isNewRecord(x: unknown): x is NewRecord {
  return typeof x === "object" && x !== null && !(x instanceof Uint8Array) && "value" in x;
}

/** The wire form of one record (docs/api.md, "Enqueue"). */
export function encodeRecord(item: Value | NewRecord, headers?: Record<string, string>): Json {
  const rec: NewRecord = isNewRecord(item) ? item : { value: item, headers };
  const out: Json = rec.value instanceof Uint8Array ?
    { value: Buffer.from(rec.value).toString("base64"), encoding: "base64" } :
    { value: rec.value };
  if (rec.headers && Object.keys(rec.headers).length) out.headers = rec.headers;
  if (rec.idempotencyKey !== undefined) out.idempotency_key = rec.idempotencyKey;
  if (rec.tags !== undefined) out.tags = rec.tags;
  if (rec.deliverAt !== undefined) out.deliver_at = rec.deliverAt;
  if (rec.delayMs !== undefined) out.delay_ms = rec.delayMs;
  return out;
}

/** The node's limits' documented defaults (docs/api.md, "Limits"), assumed until the cluster
 * map publishes the node's own. */
export const DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024;
export const DEFAULT_MAX_BATCH_RECORDS = 1000;
export const DEFAULT_MAX_RECORD_BYTES = 1024 * 1024;

// A queue name's rule, as the node's (vqueues/names.py): 1-249 UTF-8 bytes, no control
// characters (Unicode category Cc).
const MAX_NAME_BYTES = 249;
// eslint-disable-next-line no-control-regex
const CONTROL = /[\u0000-\u001f\u007f-\u009f]/;
const LONE_SURROGATE = /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/;
// `{"records":[` and `]}` around a multi-queue request's records.
const ENVELOPE_BYTES = Buffer.byteLength('{"records":[]}');
// Where a node's refusal of a whole request names the record it refused for.
const RECORD_AT = /records\[(\d+)\]/g;

function refusal(status: number, code: string, message: string, extra: Json = {}): VQError {
  return errorFrom(status, { error: { code, message, retriable: false, ...extra } });
}

/** The node's `400 invalid_name` for `queue`, found before sending; null if it is valid. */
export function nameError(queue: string, what = "queue"): VQError | null {
  if (typeof queue !== "string") return refusal(400, "invalid_name", `${what} name must be a string`);
  if (LONE_SURROGATE.test(queue)) return refusal(400, "invalid_name", `${what} name is not valid UTF-8`);
  const size = Buffer.byteLength(queue, "utf8");
  if (size === 0) return refusal(400, "invalid_name", `${what} name must not be empty`);
  if (size > MAX_NAME_BYTES) {
    return refusal(400, "invalid_name",
                   `${what} name is ${size} UTF-8 bytes; at most ${MAX_NAME_BYTES} allowed`);
  }
  if (CONTROL.test(queue)) {
    return refusal(400, "invalid_name", `${what} name must not contain control characters`);
  }
  return null;
}

/** One record of a multi-queue request as the JSON sent, and its value's size as the node
 * counts it (decoded bytes). */
export function encodeForMany(queue: string, item: Value | NewRecord
                              ): { data: Buffer; valueBytes: number } {
  const data = Buffer.from(JSON.stringify({ queue, ...encodeRecord(item) }), "utf8");
  const value = isNewRecord(item) ? item.value : item;
  const valueBytes = value === null || value === undefined ? 0 :
    value instanceof Uint8Array ? value.byteLength : Buffer.byteLength(value, "utf8");
  return { data, valueBytes };
}

/** The size of a multi-queue request holding records of these encoded sizes. */
export function requestBytes(sizes: number[]): number {
  return ENVELOPE_BYTES + sizes.reduce((a, b) => a + b, 0) + Math.max(0, sizes.length - 1);
}

/** The one record (its index in the request) a node's refusal of a whole multi-queue request
 * of `count` records names (`records[i]`), or null. */
export function namedRecord(err: VQError, count: number): number | null {
  if (err.retriable || err.status < 400 || err.status >= 500) return null;
  const match = /records\[(\d+)\]/.exec(err.message);
  const index = err.details.index;
  const at = match ? Number(match[1]) : typeof index === "number" ? index : null;
  return at !== null && at >= 0 && at < count ? at : null;
}

/** `err` with the records it names by their place in the client's own request (`records[k]`,
 * `index`, `first_index`) named as the caller knows them: `name(k)` in the message, `index(k)`
 * in the details (dropped where undefined). */
export function renamed(err: VQError, name: (k: number) => string,
                        index: (k: number) => number | undefined): VQError {
  const raw = typeof err.details.message === "string" ? err.details.message :
    err.message.replace(/^\d+ [a-z_]+: /, "");
  const message = raw.replace(RECORD_AT, (_, k: string) => name(Number(k)));
  const details: Json = { ...err.details, code: err.code, message, retriable: err.retriable };
  for (const field of ["index", "first_index"]) {
    const k = details[field];
    delete details[field];
    if (typeof k === "number" && index(k) !== undefined) details[field] = index(k);
  }
  return errorFrom(err.status, { error: details });
}

function decodeRecord(raw: Json): QueueRecord {
  const b64 = raw.encoding === "base64";
  const headers: Record<string, string> = {};
  for (const [k, v] of Object.entries((raw.headers ?? {}) as Record<string, string | null>)) {
    headers[k] = v === null ? "" : b64 ? Buffer.from(v, "base64").toString("utf8") : v;
  }
  const value = raw.value as string | null;
  const data = value === null ? null :
    b64 ? new Uint8Array(Buffer.from(value, "base64")) : new Uint8Array(Buffer.from(value));
  return new QueueRecord(raw.offset as number, raw.timestamp as number, data, headers);
}

function batch<T, R>(leases: Lease[], completed: unknown, refused: unknown
                     ): Lease[] & { readonly completed: T[]; readonly refused: R[] } {
  return Object.defineProperties(leases, {
    completed: { value: (completed ?? []) as T[], enumerable: false },
    refused: { value: (refused ?? []) as R[], enumerable: false },
  }) as Lease[] & { readonly completed: T[]; readonly refused: R[] };
}

function decodeLease(raw: Json): Lease {
  return new Lease(decodeRecord(raw), raw.token as string, raw.attempt as number,
                   raw.deadline as number, raw.queue as string | undefined,
                   raw.partition as number | undefined);
}

/** Wait `ms`, or less if `signal` aborts (then it rejects). */
export function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason);
    const timer = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, ms);
    const onAbort = () => {
      clearTimeout(timer);
      reject(signal?.reason);
    };
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}

const q = encodeURIComponent;
const COMMA = Buffer.from(",");

/**
 * `const vq = new Client(["http://127.0.0.1:8080"]); await vq.enqueue("q", "x")`.
 *
 * Routes each call to the node that owns the queue's partition (Kafka's murmur2 of the name,
 * as the server computes it). The cluster map is fetched from any of `urls`, cached, and
 * refreshed on a 409 `wrong_node`, a 503 `partition_unavailable`, a connection error, an answer
 * from a partition past the map's count, and every `refreshIntervalMs`. Retriable failures are retried with exponential backoff and full jitter
 * until the deadline.
 */
export class Client {
  readonly seeds: string[];
  partitions: number | null = null;
  owners = new Map<number, string>();
  generation = -1;
  /** The node's limits (docs/api.md, "Limits"): their documented defaults until the cluster
   * map publishes the node's own (`limits`); a 413 or `too_many_records` lowers them until the
   * next map. Records per multi-queue call (`max_batch_records`): */
  maxRecordsPerCall = DEFAULT_MAX_BATCH_RECORDS;
  /** The largest request body (`max_body_bytes`). */
  maxBodyBytes = DEFAULT_MAX_BODY_BYTES;
  /** The largest record value, decoded (`max_record_bytes`). */
  maxRecordBytes = DEFAULT_MAX_RECORD_BYTES;
  readonly deadlineMs: number;
  readonly refreshIntervalMs: number;
  readonly backoffInitialMs: number;
  readonly backoffMaxMs: number;
  /** The CA bundle given, for https:// and wss:// nodes. */
  readonly ca: ClientOptions["ca"];
  private readonly headers: Record<string, string>;
  private readonly transport: Transport;
  private mapAt = 0;
  private refreshing: Promise<Json> | null = null;

  constructor(urls: string | string[], options: ClientOptions = {}) {
    this.seeds = (typeof urls === "string" ? [urls] : urls).map((u) => u.replace(/\/+$/, ""));
    if (!this.seeds.length) throw new Error("at least one node URL is needed");
    this.deadlineMs = options.deadlineMs ?? 30_000;
    this.refreshIntervalMs = options.refreshIntervalMs ?? 30_000;
    this.backoffInitialMs = options.backoffInitialMs ?? 50;
    this.backoffMaxMs = options.backoffMaxMs ?? 2_000;
    this.headers = options.token ? { Authorization: `Bearer ${options.token}` } : {};
    this.ca = options.ca;
    this.transport = new Transport({ ca: options.ca,
                                     requestTimeoutMs: options.requestTimeoutMs ?? 60_000 });
  }

  /** Close the kept-alive connections. */
  close(): void {
    this.transport.close();
  }

  // The cluster map ------------------------------------------------------------------------

  /** Fetch the map from the first node that answers (known owners first, then seeds). */
  refreshMap(): Promise<Json> {
    this.refreshing ??= this.fetchMap().finally(() => { this.refreshing = null; });
    return this.refreshing;
  }

  private async fetchMap(): Promise<Json> {
    const candidates = [...new Set([...this.owners.values(), ...this.seeds])]
      .sort(() => Math.random() - 0.5);
    let last: unknown;
    for (const url of candidates) {
      let answer;
      try {
        answer = await this.transport.request("GET", `${url}/v1/partitions`, undefined,
                                              this.headers);
      } catch (exc) {
        last = exc;
        continue;
      }
      if (answer.status === 401 || answer.status === 403) throw errorFrom(answer.status, answer.body);
      if (answer.status !== 200) continue;
      const body = answer.body as Json;
      this.partitions = body.partitions as number;
      this.owners = new Map(Object.entries(body.owners as Record<string, { url: string }>)
        .map(([p, o]) => [Number(p), o.url]));
      this.generation = (body.generation as number | undefined) ?? 0;
      this.learnLimits(body.limits);
      this.mapAt = Date.now();
      return body;
    }
    throw new VQError(0, "no_node_reachable", `no node answered: ${last}`, {}, true);
  }

  /** Take the node's limits from its cluster map (an older node publishes none). */
  private learnLimits(limits: unknown): void {
    if (typeof limits !== "object" || limits === null) return;
    const get = (name: string): number | undefined => {
      const v = (limits as Json)[name];
      return Number.isInteger(v) && (v as number) > 0 ? v as number : undefined;
    };
    this.maxBodyBytes = get("max_body_bytes") ?? this.maxBodyBytes;
    this.maxRecordsPerCall = get("max_batch_records") ?? this.maxRecordsPerCall;
    this.maxRecordBytes = get("max_record_bytes") ?? this.maxRecordBytes;
  }

  /** A node refused a multi-queue request of records of these encoded sizes as too large
   * (`payload_too_large`, `too_many_records`): take the limit it names, or else half the
   * request (never less than its largest record alone), until the next map. */
  learnRefusal(err: VQError, sizes: number[]): void {
    const limit = err.details.max;
    const named = typeof limit === "number" && Number.isInteger(limit) && limit > 0 ? limit : 0;
    if (err.code === "too_many_records") {
      this.maxRecordsPerCall = named && named < sizes.length ? named :
        Math.max(1, Math.floor(sizes.length / 2));
      return;
    }
    const sent = requestBytes(sizes);
    this.maxBodyBytes = named && named < sent ? named :
      Math.max(Math.floor(sent / 2), requestBytes([Math.max(...sizes)]));
  }

  /** The node's 413 for a record (`name`: how to call it) whose value is over
   * `maxRecordBytes`, or that alone makes a multi-queue request over `maxBodyBytes`; null if
   * it fits. */
  sizeError(name: string, data: Buffer, valueBytes: number): VQError | null {
    if (valueBytes > this.maxRecordBytes) {
      return refusal(413, "record_too_large", `${name} is ${valueBytes} bytes; at most ` +
                     `${this.maxRecordBytes} (max_record_bytes)`, { max: this.maxRecordBytes });
    }
    const size = requestBytes([data.length]);
    if (size > this.maxBodyBytes) {
      return refusal(413, "payload_too_large", `${name} alone makes a ${size}-byte request; ` +
                     `at most ${this.maxBodyBytes} (max_body_bytes)`, { max: this.maxBodyBytes });
    }
    return null;
  }

  /** `indices`, in order, cut into multi-queue requests within the node's limits (`sizes`:
   * each index's encoded size). */
  chunks(indices: number[], sizes: number[]): number[][] {
    const out: number[][] = [];
    let chunk: number[] = [];
    let size = 0;
    for (const i of indices) {
      if (chunk.length && (chunk.length >= this.maxRecordsPerCall ||
                           requestBytes([size, sizes[i]]) > this.maxBodyBytes)) {
        out.push(chunk);
        chunk = [];
        size = 0;
      }
      size += sizes[i] + (chunk.length ? 1 : 0);
      chunk.push(i);
    }
    if (chunk.length) out.push(chunk);
    return out;
  }

  /** Fetch the map if it is unknown or older than `refreshIntervalMs`. */
  async freshMap(): Promise<void> {
    if (this.partitions === null || Date.now() - this.mapAt > this.refreshIntervalMs) {
      try {
        await this.refreshMap();
      } catch (exc) {
        if (this.partitions === null) throw exc;
      }
    }
  }

  /** The owner of `queue` in the cached map (a seed while it is unknown). */
  cachedOwner(queue: string): string {
    if (this.partitions === null) return this.seeds[0];
    return this.owners.get(partitionFor(queue, this.partitions)) ?? this.seeds[0];
  }

  private partitionOf(queue: string): number {
    return this.partitions ? partitionFor(queue, this.partitions) : -1;
  }

  /** An answer from a partition past the map's count: the partitions grew since the map
   * was fetched (docs/growing.md). */
  private grown(body: unknown): boolean {
    const partition = (body as { partition?: unknown } | null)?.partition;
    return typeof partition === "number" && this.partitions !== null &&
      partition >= this.partitions;
  }

  private async refreshQuietly(): Promise<void> {
    try {
      await this.refreshMap();
    } catch {
      // the next call tries again
    }
  }

  // Requests -------------------------------------------------------------------------------

  /** A call routed by `queue` (null: any node), retried while it fails retriably. */
  async call(method: string, queue: string | null, path: string,
             opts: CallOptions & { body?: unknown; params?: Record<string, unknown>;
                                   ok404?: boolean } = {}): Promise<Json | null> {
    const deadline = Date.now() + (opts.deadlineMs ?? this.deadlineMs);
    let delay = this.backoffInitialMs;
    let last: VQError | undefined;
    let override: string | undefined;
    const query = opts.params ? "?" + new URLSearchParams(
      Object.entries(opts.params).filter(([, v]) => v !== undefined && v !== null)
        .map(([k, v]) => [k, String(v)])).toString() : "";
    for (;;) {
      if (queue) {
        try {
          await this.freshMap();
        } catch (exc) {  // no node answered for the map: retried like any call
          if (!(exc instanceof VQError) || !exc.retriable) throw exc;
          last = exc;
          override = undefined;
          const remaining = deadline - Date.now();
          if (remaining <= 0) throw new DeadlineExceededError(last);
          await sleep(Math.min(remaining, Math.random() * delay), opts.signal);
          delay = Math.min(this.backoffMaxMs, delay * 2);
          continue;
        }
      }
      const base = override ?? (queue ? this.cachedOwner(queue) : this.seeds[0]);
      override = undefined;
      try {
        const answer = await this.transport.request(method, base + path + query, opts.body,
                                                    this.headers, opts.signal);
        if (answer.status < 300) {
          if (queue && this.grown(answer.body)) await this.refreshQuietly();
          return (answer.body ?? {}) as Json;
        }
        last = errorFrom(answer.status, answer.body);
        if (answer.status === 404 && opts.ok404) return null;
        if (last.code === "wrong_node") {
          override = last.details.owner as string | undefined;
          await this.refreshQuietly();
        } else if ((answer.status === 429 || answer.status === 503) &&
                   answer.headers["retry-after"]) {
          delay = Math.max(delay, Math.min(Number(answer.headers["retry-after"]) * 1000,
                                           5_000) / 4);
          if (last.code === "partition_unavailable") await this.refreshQuietly();
        }
        if (!last.retriable && last.code !== "wrong_node") throw last;
      } catch (exc) {
        if (exc instanceof VQError) throw exc;
        if (opts.signal?.aborted) throw opts.signal.reason;
        last = new VQError(0, "connection_error", `${base}: ${(exc as Error).message}`, {}, true);
        await this.refreshQuietly();
      }
      const remaining = deadline - Date.now();
      if (remaining <= 0) throw new DeadlineExceededError(last);
      if (override === undefined) {
        await sleep(Math.min(remaining, Math.random() * delay), opts.signal);
        delay = Math.min(this.backoffMaxMs, delay * 2);
      }
    }
  }

  /** One call to one node, never sent elsewhere, retried while it fails retriably (not on
   * `wrong_node`: the caller follows the map). */
  async callNode(url: string, method: string, path: string, body?: unknown,
                 opts: CallOptions = {}): Promise<Json> {
    const deadline = Date.now() + (opts.deadlineMs ?? this.deadlineMs);
    let delay = this.backoffInitialMs;
    let last: VQError;
    for (;;) {
      try {
        const answer = await this.transport.request(method, url + path, body, this.headers,
                                                    opts.signal);
        if (answer.status < 300) return (answer.body ?? {}) as Json;
        last = errorFrom(answer.status, answer.body);
        if (!last.retriable || last.code === "wrong_node") throw last;
      } catch (exc) {
        if (exc instanceof VQError && exc.status !== 0) throw exc;
        if (opts.signal?.aborted) throw opts.signal.reason;
        last = new VQError(0, "connection_error", `${url}: ${(exc as Error).message}`, {}, true);
        if ((exc as NodeJS.ErrnoException).code === "ECONNREFUSED") throw last;
      }
      const remaining = deadline - Date.now();
      if (remaining <= 0) throw new DeadlineExceededError(last);
      await sleep(Math.min(remaining, Math.random() * delay), opts.signal);
      delay = Math.min(this.backoffMaxMs, delay * 2);
    }
  }

  private static c(queue: string, consumer: string): string {
    return `/v1/queues/${q(queue)}/consumers/${q(consumer)}`;
  }

  private static tokens(leases: Tokens): string[] {
    return (Array.isArray(leases) ? leases : [leases])
      .map((x) => (typeof x === "string" ? x : x.token));
  }

  // Records --------------------------------------------------------------------------------

  /** Enqueue one value or a list, in one request and in this order; `Uint8Array`s go base64,
   * strings as UTF-8. A retried enqueue may write twice (at-least-once) unless the records
   * carry idempotency keys. */
  async enqueue(queue: string, values: Value | NewRecord | Array<Value | NewRecord>,
                opts: EnqueueOptions = {}): Promise<EnqueueResult> {
    let items = Array.isArray(values) ? values : [values];
    const single = [opts.idempotencyKey, opts.tags, opts.deliverAt, opts.delayMs]
      .some((x) => x !== undefined);
    if (single) {
      if (items.length !== 1 || isNewRecord(items[0])) {
        throw new TypeError("idempotencyKey, tags, deliverAt and delayMs are for one plain " +
                            "value; give each NewRecord its own");
      }
      items = [{ value: items[0] as Value, headers: opts.headers,
                 idempotencyKey: opts.idempotencyKey, tags: opts.tags,
                 deliverAt: opts.deliverAt, delayMs: opts.delayMs }];
    }
    const body = await this.call("POST", queue, `/v1/queues/${q(queue)}/records`, {
      ...opts, body: { records: items.map((v) => encodeRecord(v, opts.headers)) } });
    return { partition: body!.partition as number, offsets: body!.offsets as number[] | null };
  }

  /** Enqueue records to many queues: one `POST /v1/records` per owner node (in calls of at
   * most `maxRecordsPerCall` records and `maxBodyBytes` bytes, the node's limits), the owners
   * in parallel. Records that fail retriably (`wrong_node`: the map is refreshed and they go to
   * the new owner; a partition moving or replaying; a broker error; a lost connection; no node
   * answering) are sent again, before any later record of their queue, until the deadline.
   * Each queue's records keep their order. One result per record, in order; a record that
   * failed for good has `error` (nothing is thrown for it): a bad queue name or a value over
   * `maxRecordBytes` before anything is sent; a record a node refuses the whole call for (a
   * 400 or 413 naming it) alone, named `records[i]` by its place in `records`, the call's
   * other records sent again. A call refused as too large is split and sent again. Throws for
   * a refusal of a whole call that names no record (401, 403, 415...). */
  async enqueueMany(records: Array<[string, Value | NewRecord]>,
                    opts: CallOptions = {}): Promise<RecordResult[]> {
    const deadline = Date.now() + (opts.deadlineMs ?? this.deadlineMs);
    const queues = records.map(([queue]) => queue);
    const encoded = records.map(([queue, v]) => encodeForMany(queue, v));
    const results: Array<RecordResult | undefined> = new Array(records.length);
    const last = new Map<number, VQError>();
    let todo: number[] = [];
    queues.forEach((queue, i) => {
      const bad = nameError(queue, `records[${i}].queue`);
      if (bad) results[i] = { queue, partition: -1, offset: null, error: bad };
      else todo.push(i);
    });
    let delay = this.backoffInitialMs;
    while (todo.length) {
      let mapped = true;
      try {
        await this.freshMap();
      } catch (exc) {  // no node answers: wait and ask again, until the deadline
        if (!(exc instanceof VQError) || !exc.retriable) throw exc;
        for (const i of todo) last.set(i, exc);
        mapped = false;
      }
      if (mapped) {
        const byOwner = new Map<string, number[]>();
        for (const i of todo) {
          const bad = this.sizeError(`records[${i}]`, encoded[i].data, encoded[i].valueBytes);
          if (bad) {
            results[i] = { queue: queues[i], partition: this.partitionOf(queues[i]),
                           offset: null, error: bad };
            continue;
          }
          const url = this.cachedOwner(queues[i]);
          byOwner.set(url, [...(byOwner.get(url) ?? []), i]);
        }
        const rounds = await Promise.all([...byOwner].map(([url, indices]) =>
          this.enqueueAt(url, queues, encoded, indices, results, last, opts.signal)));
        todo = rounds.flatMap(([retry]) => retry).sort((a, b) => a - b);
        if (!todo.length) break;
        if (rounds.some(([, refresh]) => refresh)) await this.refreshQuietly();
      }
      const remaining = deadline - Date.now();
      if (remaining <= 0) {
        for (const i of todo) {
          results[i] = { queue: queues[i], partition: this.partitionOf(queues[i]),
                         offset: null, error: new DeadlineExceededError(last.get(i)) };
        }
        break;
      }
      if (!todo.every((i) => last.get(i)?.code === "wrong_node")) {
        await sleep(Math.min(remaining, Math.random() * delay), opts.signal);
        delay = Math.min(this.backoffMaxMs, delay * 2);
      }
    }
    return results as RecordResult[];
  }

  /** `err`, about a call of `chunk`'s records, naming them by their place in the caller's
   * list. */
  private static inCall(err: VQError, chunk: number[]): VQError {
    const ours = (k: number) => (k >= 0 && k < chunk.length ? chunk[k] : k);
    return renamed(err, (k) => `records[${ours(k)}]`, ours);
  }

  private async enqueueAt(url: string, queues: string[],
                          encoded: Array<{ data: Buffer; valueBytes: number }>,
                          indices: number[], results: Array<RecordResult | undefined>,
                          last: Map<number, VQError>, signal?: AbortSignal
                          ): Promise<[number[], boolean]> {
    const retry: number[] = [];
    const held = new Set<string>();
    let refresh = false;
    const sizes = encoded.map((e) => e.data.length);
    const work = this.chunks(indices, sizes);
    while (work.length) {
      const chunk: number[] = [];
      for (const i of work.shift()!) (held.has(queues[i]) ? retry : chunk).push(i);
      if (!chunk.length) continue;
      let answers: Json[];
      try {
        answers = await this.postEncoded(url, chunk.map((i) => encoded[i].data), signal);
      } catch (exc) {
        if (!(exc instanceof VQError)) throw exc;
        if (exc.retriable) {
          refresh ||= exc.status === 0 || exc.status === 503;
          for (const i of chunk) {
            retry.push(i);
            last.set(i, exc);
            held.add(queues[i]);
          }
          continue;
        }
        let at = namedRecord(exc, chunk.length);
        if (at === null && chunk.length === 1 && exc.code === "payload_too_large") at = 0;
        if (at !== null) {  // that record fails alone; the others go again
          const i = chunk[at];
          results[i] = { queue: queues[i], partition: this.partitionOf(queues[i]), offset: null,
                         error: Client.inCall(exc, chunk) };
          if (chunk.length > 1) work.unshift([...chunk.slice(0, at), ...chunk.slice(at + 1)]);
          continue;
        }
        if (exc.code === "payload_too_large" || exc.code === "too_many_records") {
          this.learnRefusal(exc, chunk.map((i) => sizes[i]));
          work.unshift(...this.chunks(chunk, sizes));
          continue;
        }
        throw exc;
      }
      chunk.forEach((i, n) => {
        const answer = answers[n];
        const queue = queues[i];
        if (!("error" in answer)) {
          results[i] = { queue, partition: answer.partition as number,
                         offset: (answer.offset as number | null | undefined) ?? null };
          return;
        }
        const err = errorFrom((answer.status as number | undefined) ?? 0, answer);
        if (err.retriable || err.code === "wrong_node") {
          retry.push(i);
          last.set(i, err);
          held.add(queue);
          refresh ||= err.code === "wrong_node" || err.code === "partition_unavailable";
        } else {
          results[i] = { queue, partition: (answer.partition as number | undefined) ?? -1,
                         offset: null, error: Client.inCall(err, chunk) };
        }
      });
    }
    return [retry, refresh];
  }

  /** One `POST /v1/records` to one node, not retried: its per-record answers. Throws a
   * VQError for a refusal of the whole request, or a transport failure (status 0). */
  postRecords(url: string, items: Json[], signal?: AbortSignal): Promise<Json[]> {
    return this.postEncoded(url, items.map((item) => Buffer.from(JSON.stringify(item))), signal);
  }

  /** `postRecords` with each record already encoded (`encodeForMany`): the body is exactly
   * `requestBytes` of their sizes. */
  async postEncoded(url: string, records: Buffer[], signal?: AbortSignal): Promise<Json[]> {
    const parts: Buffer[] = [Buffer.from('{"records":[')];
    records.forEach((r, n) => parts.push(...(n ? [COMMA, r] : [r])));
    parts.push(Buffer.from("]}"));
    let answer;
    try {
      answer = await this.transport.request("POST", `${url}/v1/records`, Buffer.concat(parts),
                                            this.headers, signal);
    } catch (exc) {
      if (signal?.aborted) throw signal.reason;
      throw new VQError(0, "connection_error", `${url}: ${(exc as Error).message}`, {}, true);
    }
    if (answer.status >= 300) throw errorFrom(answer.status, answer.body);
    return (answer.body as { results: Json[] }).results;
  }

  /** Read records from `offset`, the consumer's committed offset, or the queue's first
   * retained record; long-polls up to `waitMs` when there are none. */
  async read(queue: string, opts: ReadOptions = {}): Promise<ReadResult> {
    const body = await this.call("GET", queue, `/v1/queues/${q(queue)}/records`, {
      ...opts, deadlineMs: (opts.deadlineMs ?? this.deadlineMs) + (opts.waitMs ?? 0),
      params: { consumer: opts.consumer, offset: opts.offset, limit: opts.limit,
                wait_ms: opts.waitMs, tag: opts.tag } });
    return { partition: body!.partition as number,
             records: (body!.records as Json[]).map(decodeRecord),
             nextOffset: body!.next_offset as number };
  }

  /** Commit `offset`, the consumer's next offset to read. */
  async ack(queue: string, consumer: string, offset: number,
            opts: CallOptions & { allowRewind?: boolean } = {}): Promise<AckResult> {
    return (await this.call("POST", queue, Client.c(queue, consumer) + "/ack", {
      ...opts, body: { offset, allow_rewind: opts.allowRewind ?? false } })) as unknown as AckResult;
  }

  /** Cancel a scheduled record (its id: the offset its enqueue answered) before it is due;
   * null if it is not waiting any more. */
  async cancelScheduled(queue: string, id: number, opts: CallOptions = {}
                        ): Promise<ScheduledCancellation | null> {
    return await this.call("DELETE", queue, `/v1/queues/${q(queue)}/scheduled/${id}`,
                     { ...opts, ok404: true }) as unknown as ScheduledCancellation | null;
  }

  /** The queue's partition, record count, offsets and consumers; null if unknown. */
  async queueInfo(queue: string, opts: CallOptions = {}): Promise<QueueInfo | null> {
    return await this.call("GET", queue, `/v1/queues/${q(queue)}`,
                           { ...opts, ok404: true }) as unknown as QueueInfo | null;
  }

  /** Delete the queue and its consumers; null if it did not exist. */
  async deleteQueue(queue: string, opts: CallOptions = {}): Promise<QueueDeletion | null> {
    return await this.call("DELETE", queue, `/v1/queues/${q(queue)}`,
                           { ...opts, ok404: true }) as unknown as QueueDeletion | null;
  }

  async deleteConsumer(queue: string, consumer: string, opts: CallOptions = {}
                       ): Promise<ConsumerDeletion | null> {
    return await this.call("DELETE", queue, Client.c(queue, consumer),
                           { ...opts, ok404: true }) as unknown as ConsumerDeletion | null;
  }

  /** The cluster map as a node serves it (`GET /v1/partitions`). */
  async clusterMap(): Promise<PartitionsInfo> {
    return await this.refreshMap() as unknown as PartitionsInfo;
  }

  // Work queues ----------------------------------------------------------------------------

  /** Set a consumer's settings; fields left out keep their value (`deadLetterQueue: null`
   * removes the dead-letter queue). */
  async configureConsumer(queue: string, consumer: string, settings: ConsumerSettings,
                          opts: CallOptions = {}): Promise<ConsumerSettingsInfo> {
    const body: Json = {};
    if (settings.mode !== undefined) body.mode = settings.mode;
    if (settings.maxAttempts !== undefined) body.max_attempts = settings.maxAttempts;
    if (settings.deadLetterQueue !== undefined) body.dead_letter_queue = settings.deadLetterQueue;
    if (settings.visibilityMs !== undefined) body.visibility_ms = settings.visibilityMs;
    if (settings.maxInFlight !== undefined) body.max_in_flight = settings.maxInFlight;
    if (settings.durableGrants !== undefined) body.durable_grants = settings.durableGrants;
    return await this.call("PUT", queue, Client.c(queue, consumer),
                           { ...opts, body }) as unknown as ConsumerSettingsInfo;
  }

  async consumerSettings(queue: string, consumer: string, opts: CallOptions = {}
                         ): Promise<ConsumerSettingsInfo | null> {
    return await this.call("GET", queue, Client.c(queue, consumer),
                           { ...opts, ok404: true }) as unknown as ConsumerSettingsInfo | null;
  }

  /** Lease up to `maxRecords` records no other worker holds (long poll: `waitMs`),
   * completing the tokens in `complete` first, in the same write: one round trip per cycle.
   * A call that fails may have completed them: send them again (completing is idempotent). */
  async lease(queue: string, consumer: string, opts: LeaseOptions = {}): Promise<LeaseBatch> {
    const body: Json = { max_records: opts.maxRecords ?? 1, wait_ms: opts.waitMs ?? 0 };
    if (opts.visibilityMs !== undefined) body.visibility_ms = opts.visibilityMs;
    if (opts.tag !== undefined) body.tag = opts.tag;
    const complete = opts.complete === undefined ? [] : Client.tokens(opts.complete);
    if (complete.length) body.complete = complete;
    const out = await this.call("POST", queue, Client.c(queue, consumer) + "/lease", {
      ...opts, body, deadlineMs: (opts.deadlineMs ?? this.deadlineMs) + (opts.waitMs ?? 0) });
    return batch<string, RefusedToken>((out!.records as Json[]).map(decodeLease),
                                       out!.completed, out!.refused);
  }

  /** Finish leased records for good; 409 `lease_expired` if a lease is not current any more
   * (then nothing was done). */
  async complete(queue: string, consumer: string, leases: Tokens,
                 opts: CallOptions = {}): Promise<SettleResult> {
    return await this.call("POST", queue, Client.c(queue, consumer) + "/complete", {
      ...opts, body: { tokens: Client.tokens(leases) } }) as unknown as SettleResult;
  }

  /** Give leased records back, available again after `delayMs`; a record that used up its
   * attempts goes to the consumer's dead-letter queue instead. */
  async retry(queue: string, consumer: string, leases: Tokens,
              opts: CallOptions & { delayMs?: number; reason?: string } = {}
              ): Promise<SettleResult> {
    const body: Json = { tokens: Client.tokens(leases), delay_ms: opts.delayMs ?? 0 };
    if (opts.reason !== undefined) body.reason = opts.reason;
    return await this.call("POST", queue, Client.c(queue, consumer) + "/retry",
                           { ...opts, body }) as unknown as SettleResult;
  }

  // The cluster ----------------------------------------------------------------------------

  /** Every node in the cluster map (the seeds if no partition has an owner yet). */
  async nodeUrls(): Promise<string[]> {
    await this.refreshMap();
    const urls = [...new Set(this.owners.values())].sort();
    return urls.length ? urls : [...this.seeds];
  }

  /** Queue names (or, with `stats`, one summary each) across the whole cluster, sorted by
   * name: every node's listing, paged and merged. */
  async listQueues(prefix = "", opts: { limit?: number; stats?: boolean } = {}
                   ): Promise<Array<string | Json>> {
    const out: Array<string | Json> = [];
    for (const url of await this.nodeUrls()) {
      let after: string | null = null;
      for (;;) {
        const params = new URLSearchParams({ prefix, limit: "1000",
                                             stats: String(opts.stats ?? false) });
        if (after !== null) params.set("after", after);
        const body = await this.callNode(url, "GET", `/v1/queues?${params}`);
        out.push(...((opts.stats ? body.stats : body.queues) as Array<string | Json>));
        after = body.next_after as string | null;
        if (after === null || (opts.limit !== undefined && out.length >= opts.limit * 2)) break;
      }
    }
    const key = (x: string | Json) => (typeof x === "string" ? x : String(x.queue));
    out.sort((a, b) => (key(a) < key(b) ? -1 : key(a) > key(b) ? 1 : 0));
    return opts.limit === undefined ? out : out.slice(0, opts.limit);
  }

  /** Each node's own view: its `/readyz` answer (`status`, `owned`, `ready`, `details`) or,
   * if it did not answer, `error`. */
  async nodes(): Promise<Json[]> {
    const out: Json[] = [];
    for (const url of await this.nodeUrls()) {
      try {
        const answer = await this.transport.request("GET", `${url}/readyz`, undefined,
                                                    this.headers);
        out.push(typeof answer.body === "object" && answer.body !== null ?
          { url, ...(answer.body as Json) } : { url, error: `HTTP ${answer.status}` });
      } catch (exc) {
        out.push({ url, status: "unreachable", error: (exc as Error).message });
      }
    }
    return out;
  }

  /** The offset of the queue's first record stamped at or after `timestampMs` (the queue's
   * end if none): a binary search over one-record reads, like Kafka's offsets-for-times.
   * Assumes the queue's timestamps do not go back in time. */
  async findOffset(queue: string, timestampMs: number): Promise<number> {
    const info = await this.queueInfo(queue);
    if (info === null || info.first_offset === null || info.last_offset === null) {
      throw errorFrom(404, { error: { code: "queue_not_found",
                                      message: `queue ${queue} has no records` } });
    }
    let lo = info.first_offset;
    let hi = info.last_offset + 1;
    const end = hi;
    while (lo < hi) {  // the smallest start whose first record is at or after timestampMs
      const mid = Math.floor((lo + hi) / 2);
      const page = await this.read(queue, { offset: mid, limit: 1 });
      if (page.records.length && page.records[0].timestamp < timestampMs) {
        lo = page.records[0].offset + 1;
      } else {
        hi = mid;
      }
    }
    const page = await this.read(queue, { offset: lo, limit: 1 });
    return page.records.length ? page.records[0].offset : end;
  }

  // Prefix consumers: one pool of workers for every queue under a prefix ----------------------

  private static p(consumer: string): string {
    return `/v1/prefix-consumers/${q(consumer)}`;
  }

  /** Define (or redefine) `consumer` over every queue whose name starts with `prefix`
   * (docs/work-queues.md); `deadLetterQueue` may hold `{queue}`: one per queue. */
  async configurePrefixConsumer(consumer: string, prefix: string, settings: {
    maxAttempts?: number; visibilityMs?: number; deadLetterQueue?: string;
    maxInFlight?: number; weights?: Record<string, number>; recordsPerTurn?: number;
    durableGrants?: boolean;
  } = {}, opts: CallOptions = {}): Promise<Json> {
    const body: Json = { prefix };
    if (settings.maxAttempts !== undefined) body.max_attempts = settings.maxAttempts;
    if (settings.visibilityMs !== undefined) body.visibility_ms = settings.visibilityMs;
    if (settings.deadLetterQueue !== undefined) body.dead_letter_queue = settings.deadLetterQueue;
    if (settings.maxInFlight !== undefined) body.max_in_flight = settings.maxInFlight;
    if (settings.weights !== undefined) body.weights = settings.weights;
    if (settings.recordsPerTurn !== undefined) body.records_per_turn = settings.recordsPerTurn;
    if (settings.durableGrants !== undefined) body.durable_grants = settings.durableGrants;
    return (await this.call("PUT", null, Client.p(consumer), { ...opts, body }))!;
  }

  deletePrefixConsumer(consumer: string, opts: CallOptions = {}): Promise<Json | null> {
    return this.call("DELETE", null, Client.p(consumer), { ...opts, ok404: true });
  }

  /** Every prefix consumer, with its queues, queues waiting for a turn, records in flight and
   * backlog summed over the nodes. */
  async prefixConsumers(): Promise<Json[]> {
    const counts = ["queues", "ready_queues", "in_flight", "backlog"];
    const merged = new Map<string, Json>();
    for (const url of await this.nodeUrls()) {
      const body = await this.callNode(url, "GET", "/v1/prefix-consumers");
      for (const info of body.prefix_consumers as Json[]) {
        const name = info.consumer as string;
        const seen = merged.get(name) ?? { ...info, ...Object.fromEntries(counts.map((c) => [c, 0])) };
        for (const c of counts) seen[c] = (seen[c] as number) + ((info[c] as number) ?? 0);
        merged.set(name, seen);
      }
    }
    return [...merged.keys()].sort().map((k) => merged.get(k)!);
  }

  /** Lease up to `maxRecords` records from the queues under `consumer`'s prefix that `node`
   * (a URL of `nodeUrls()`) owns, queue by queue in turn; each names its `queue`. Settle them
   * with the same node; `complete` (leases of that node) are completed first, in the same
   * write as their partition's grants (`completed`, `refused`: `wrong_node` for a queue that
   * node does not serve). */
  async leasePrefix(consumer: string, node: string, opts: PrefixLeaseOptions = {}
                    ): Promise<PrefixLeaseBatch> {
    const body: Json = { max_records: opts.maxRecords ?? 1, wait_ms: opts.waitMs ?? 0 };
    if (opts.visibilityMs !== undefined) body.visibility_ms = opts.visibilityMs;
    if (opts.complete?.length) body.complete = Client.pairs(opts.complete);
    const out = await this.callNode(node, "POST", Client.p(consumer) + "/lease", body, {
      ...opts, deadlineMs: (opts.deadlineMs ?? this.deadlineMs) + (opts.waitMs ?? 0) });
    return batch<PrefixToken, PrefixRefusedToken>((out.records as Json[]).map(decodeLease),
                                                  out.completed, out.refused);
  }

  private static pairs(leases: Array<Lease | PrefixToken>
                       ): Array<{ queue: string; token: string }> {
    return leases.map((x) => {
      if (x.queue === undefined) {
        throw new TypeError("prefix calls take leases from a prefix lease (they name a queue)");
      }
      return { queue: x.queue, token: x.token };
    });
  }

  /** Complete leases of many queues at once; all or nothing (409 `lease_expired` names every
   * stale one as {queue, token}). */
  completePrefix(consumer: string, node: string, leases: Lease[],
                 opts: CallOptions = {}): Promise<Json> {
    return this.callNode(node, "POST", Client.p(consumer) + "/complete",
                         { tokens: Client.pairs(leases) }, opts);
  }

  retryPrefix(consumer: string, node: string, leases: Lease[],
              opts: CallOptions & { delayMs?: number; reason?: string } = {}): Promise<Json> {
    const body: Json = { tokens: Client.pairs(leases), delay_ms: opts.delayMs ?? 0 };
    if (opts.reason !== undefined) body.reason = opts.reason;
    return this.callNode(node, "POST", Client.p(consumer) + "/retry", body, opts);
  }

  extendPrefix(consumer: string, node: string, leases: Lease[], visibilityMs: number,
               opts: CallOptions = {}): Promise<Json> {
    return this.callNode(node, "POST", Client.p(consumer) + "/extend",
                         { tokens: Client.pairs(leases), visibility_ms: visibilityMs }, opts);
  }

  /** A WebSocket stream of the queue's records for `consumer`, from the queue's owner, under
   * credit (`Stream`); a `wrong_node` answer to the upgrade refreshes the map and tries the
   * owner it names, once. */
  async stream(queue: string, consumer: string, opts: StreamOptions = {}): Promise<Stream> {
    await this.freshMap();
    const params = new URLSearchParams();
    if (opts.mode) params.set("mode", opts.mode);
    if (opts.visibilityMs !== undefined) params.set("visibility_ms", String(opts.visibilityMs));
    if (opts.tag !== undefined) params.set("tag", opts.tag);
    const path = `${Client.c(queue, consumer)}/stream${params.size ? "?" + params : ""}`;
    const decode = (raw: Json) => ("token" in raw ? decodeLease(raw) : decodeRecord(raw));
    let base = this.cachedOwner(queue);
    for (let attempt = 0; ; attempt++) {
      try {
        return await Stream.open(this, base.replace(/^http/, "ws") + path, this.headers,
                                 decode, opts.credit ?? 100, opts.signal,
                                 opts.completeDelayMs);
      } catch (exc) {
        if (!(exc instanceof VQError) || exc.code !== "wrong_node" || attempt > 0) throw exc;
        await this.refreshQuietly();
        base = (exc.details.owner as string | undefined) ?? this.cachedOwner(queue);
      }
    }
  }

  /** Move the leases' deadline to now + `visibilityMs`. */
  async extend(queue: string, consumer: string, leases: Tokens, visibilityMs: number,
               opts: CallOptions = {}): Promise<SettleResult> {
    return await this.call("POST", queue, Client.c(queue, consumer) + "/extend", {
      ...opts, body: { tokens: Client.tokens(leases), visibility_ms: visibilityMs } }
    ) as unknown as SettleResult;
  }
}
