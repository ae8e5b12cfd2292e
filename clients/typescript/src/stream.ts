import { type Client, type Lease, MAX_RIDING_TOKENS, type QueueRecord } from "./client.js";
import { VQError, errorFrom } from "./errors.js";
import type { RefusedToken } from "./types.js";

export interface StreamOptions {
  /** lease or cursor; the consumer's own mode when unset. */
  mode?: "lease" | "cursor";
  visibilityMs?: number;
  tag?: string;
  /** Records the node may send ahead of those taken from the stream (100; at most 10,000). */
  credit?: number;
  /** How long tokens given to `completeWithCredit` wait for a credit frame to carry them, ms
   * (50): when none goes out within it, they are completed alone. */
  completeDelayMs?: number;
  signal?: AbortSignal;
}

/** What the node did with tokens completed on a credit frame: `completed` (done, or found
 * done already) and `refused` (`lease_expired`: not current, the record comes again;
 * `invalid_token`: not a token). */
export interface CreditCompletion {
  completed: string[];
  refused: RefusedToken[];
}

interface Riding {
  tokens: string[];
  resolve: (v: CreditCompletion) => void;
  reject: (e: VQError) => void;
}

type Json = Record<string, unknown>;
type Decoder = (raw: Json) => Lease | QueueRecord;

interface Socket {
  send(data: string): void;
  close(): void;
  on(event: "message", cb: (data: Buffer) => void): void;
  on(event: "close", cb: () => void): void;
  on(event: "error", cb: (err: Error) => void): void;
  on(event: "open", cb: () => void): void;
  on(event: "unexpected-response", cb: (req: unknown, res: { statusCode?: number;
    on(e: "data", cb: (c: Buffer) => void): void; on(e: "end", cb: () => void): void }) => void): void;
}

/**
 * A WebSocket stream of one queue's records (docs/work-queues.md, "Streaming over a
 * WebSocket"), from the queue's owner, under credit: `for await (const lease of stream)`.
 * Each record taken grants one more credit, so the node keeps at most `credit` records
 * ahead. In lease mode settle with `complete`, `retry`, `extend`, or have the next credit frame
 * carry the tokens (`completeWithCredit`: one frame and one write per cycle); in cursor mode
 * `ack`. Each op resolves to its HTTP route's answer, or rejects with the node's error. Needs
 * the `ws` package (an optional dependency: Node 20 has no WebSocket of its own).
 */
export class Stream implements AsyncIterable<Lease | QueueRecord> {
  private readonly buffered: Array<Lease | QueueRecord> = [];
  private readonly ops = new Map<number, { resolve: (v: Json) => void;
                                            reject: (e: VQError) => void }>();
  private waiter: (() => void) | null = null;
  private ended: VQError | null | undefined = undefined;  // null: closed cleanly
  private nextId = 1;
  private riding: Riding[] = [];  // tokens waiting for the next credit frame
  private ridingTimer: NodeJS.Timeout | undefined;
  private readonly completeDelayMs: number;

  private constructor(private readonly socket: Socket, private readonly decode: Decoder,
                      completeDelayMs = 50) {
    this.completeDelayMs = completeDelayMs;
    socket.on("message", (data) => this.onFrame(JSON.parse(data.toString("utf8")) as Json));
    socket.on("close", () => this.finish(null));
    socket.on("error", (err) => this.finish(
      new VQError(0, "connection_error", err.message, {}, true)));
  }

  /** Open a stream on `url` (the queue's owner); `decode` turns a frame's record into a Lease
   * or a record. */
  static async open(client: Client, url: string, headers: Record<string, string>,
                    decode: Decoder, credit: number, signal?: AbortSignal,
                    completeDelayMs?: number): Promise<Stream> {
    let WebSocketImpl: new (url: string, opts: { headers: Record<string, string>;
                                                 ca?: unknown }) => Socket;
    try {
      WebSocketImpl = (await import("ws")).default as unknown as typeof WebSocketImpl;
    } catch {
      throw new Error("the stream needs the `ws` package (npm install ws)");
    }
    const socket = new WebSocketImpl(url, { headers, ca: client.ca });
    await new Promise<void>((resolve, reject) => {
      socket.on("open", () => resolve());
      socket.on("error", (err) => reject(new VQError(0, "connection_error", err.message, {},
                                                     true)));
      socket.on("unexpected-response", (_req, res) => {
        const chunks: Buffer[] = [];
        res.on("data", (c) => chunks.push(c));
        res.on("end", () => {
          let body: unknown;
          try {
            body = JSON.parse(Buffer.concat(chunks).toString("utf8"));
          } catch {
            body = undefined;
          }
          reject(errorFrom(res.statusCode ?? 0, body));
        });
      });
    });
    const stream = new Stream(socket, decode, completeDelayMs);
    signal?.addEventListener("abort", () => stream.close(), { once: true });
    stream.credit(credit);
    return stream;
  }

  /** Let the node send `n` more records; the frame carries the tokens waiting from
   * `completeWithCredit`. */
  credit(n: number): void {
    if (n <= 0 || this.ended !== undefined) return;
    const riding = this.takeRiding();
    if (!riding.length) {
      this.socket.send(JSON.stringify({ op: "credit", n }));
      return;
    }
    const tokens = [...new Set(riding.flatMap((r) => r.tokens))];
    this.op({ op: "credit", n, complete: tokens }).then(
      (result) => answerRiding(riding, result as unknown as CreditCompletion),
      (err: VQError) => {
        for (const r of riding) r.reject(err);
        // Refused for its `complete` (on a cursor stream, say), the frame added no credit.
        if (err.code === "consumer_mode_mismatch" || err.code === "invalid_token") {
          this.credit(n);
        }
      });
  }

  /**
   * Complete `tokens` with the next credit frame the stream sends (the one the next record
   * taken grants, or your own `credit(n)`), together with the others waiting: token by token,
   * in one offset-topic write. Resolves once that write is durable to what the node did with
   * these tokens; a refused token is in `refused`, not an error. Tokens no credit frame
   * carries within `completeDelayMs` (you await this before taking the next record, or no
   * record comes) are completed alone, still answered token by token. Rejects if the stream
   * ends first or the node answers an error (their completion unknown: send them again,
   * completing is idempotent); tokens still waiting at `close()` are rejected, not sent.
   * At most MAX_RIDING_TOKENS tokens a call: more reject with a RangeError, nothing sent.
   */
  completeWithCredit(tokens: Array<Lease | string> | Lease | string): Promise<CreditCompletion> {
    if (this.ended !== undefined) {
      return Promise.reject(this.ended ?? new VQError(0, "connection_error", "stream closed",
                                                      {}, true));
    }
    const list = toTokens(tokens);
    if (list.length > MAX_RIDING_TOKENS) {
      return Promise.reject(new RangeError(`at most ${MAX_RIDING_TOKENS} tokens at once`));
    }
    return new Promise((resolve, reject) => {
      this.riding.push({ tokens: list, resolve, reject });
      this.ridingTimer ??= setTimeout(() => { this.completeAlone(); }, this.completeDelayMs);
    });
  }

  complete(tokens: Array<Lease | string> | Lease | string): Promise<Json> {
    return this.op({ op: "complete", tokens: toTokens(tokens) });
  }

  retry(tokens: Array<Lease | string> | Lease | string,
        opts: { delayMs?: number; reason?: string } = {}): Promise<Json> {
    return this.op({ op: "retry", tokens: toTokens(tokens), delay_ms: opts.delayMs ?? 0,
                     ...(opts.reason !== undefined ? { reason: opts.reason } : {}) });
  }

  extend(tokens: Array<Lease | string> | Lease | string, visibilityMs: number): Promise<Json> {
    return this.op({ op: "extend", tokens: toTokens(tokens), visibility_ms: visibilityMs });
  }

  ack(offset: number): Promise<Json> {
    return this.op({ op: "ack", offset });
  }

  close(): void {
    const closed = new VQError(0, "connection_error", "stream closed", {}, true);
    for (const r of this.takeRiding(Infinity)) r.reject(closed);
    this.socket.close();
  }

  async *[Symbol.asyncIterator](): AsyncIterator<Lease | QueueRecord> {
    for (;;) {
      const next = this.buffered.shift();
      if (next !== undefined) {
        this.credit(1);
        yield next;
        continue;
      }
      if (this.ended === null) return;
      if (this.ended) throw this.ended;
      await new Promise<void>((resolve) => { this.waiter = resolve; });
    }
  }

  private op(frame: Json): Promise<Json> {
    if (this.ended !== undefined) {
      return Promise.reject(this.ended ?? new VQError(0, "connection_error", "stream closed",
                                                      {}, true));
    }
    const id = this.nextId++;
    return new Promise((resolve, reject) => {
      this.ops.set(id, { resolve, reject });
      this.socket.send(JSON.stringify({ ...frame, id }));
    });
  }

  private onFrame(frame: Json): void {
    if (frame.type === "records") {
      for (const raw of frame.records as Json[]) this.buffered.push(this.decode(raw));
      this.wake();
    } else if (frame.type === "result") {
      const op = this.ops.get(frame.id as number);
      this.ops.delete(frame.id as number);
      op?.resolve(frame.result as Json);
    } else if (frame.type === "error") {
      const err = errorFrom(0, frame);
      if (frame.final === true) {
        this.finish(err);
      } else if (frame.id !== undefined) {
        const op = this.ops.get(frame.id as number);
        this.ops.delete(frame.id as number);
        op?.reject(err);
      }
      // Otherwise it answers a frame sent without an id: a plain credit the node refused
      // (over 10,000 outstanding), which added none; the stream goes on.
    }
  }

  private finish(err: VQError | null): void {
    if (this.ended !== undefined) return;
    this.ended = err;
    const closed = err ?? new VQError(0, "connection_error", "stream closed", {}, true);
    for (const op of this.ops.values()) op.reject(closed);
    this.ops.clear();
    for (const r of this.takeRiding(Infinity)) r.reject(closed);
    this.wake();
  }

  /** The waiting completions one frame takes: up to MAX_RIDING_TOKENS tokens (what is left
   * waits for the next frame, or the timer). */
  private takeRiding(max = MAX_RIDING_TOKENS): Riding[] {
    let count = 0;
    let i = 0;
    while (i < this.riding.length && count + this.riding[i].tokens.length <= max) {
      count += this.riding[i++].tokens.length;
    }
    const taken = this.riding.splice(0, i);
    clearTimeout(this.ridingTimer);
    this.ridingTimer = undefined;
    if (this.riding.length) {
      this.ridingTimer = setTimeout(() => { this.completeAlone(); }, this.completeDelayMs);
    }
    return taken;
  }

  /** No credit frame carried them in time: the `complete` op, which is all or nothing, sent
   * again without the tokens it names as stale or invalid, so each is answered on its own. */
  private completeAlone(): void {
    const riding = this.takeRiding();
    if (!riding.length) return;
    void (async () => {
      let rest = [...new Set(riding.flatMap((r) => r.tokens))];
      const out: CreditCompletion = { completed: [], refused: [] };
      try {
        while (rest.length) {
          try {
            const done = await this.op({ op: "complete", tokens: rest });
            out.completed.push(...(done.done as string[]));
            break;
          } catch (exc) {
            if (!(exc instanceof VQError)) throw exc;
            const names = exc.code === "lease_expired" ? exc.details.stale
              : exc.code === "invalid_token" ? exc.details.invalid : undefined;
            const named = new Set((names as unknown[] | undefined ?? []).map(String));
            const left = rest.filter((t) => !named.has(t));
            if (left.length === rest.length) throw exc;  // names none of them: not a refusal
            for (const t of rest) if (named.has(t)) out.refused.push({ token: t, code: exc.code });
            rest = left;
          }
        }
      } catch (exc) {
        for (const r of riding) r.reject(exc as VQError);
        return;
      }
      answerRiding(riding, out);
    })();
  }

  private wake(): void {
    const w = this.waiter;
    this.waiter = null;
    w?.();
  }
}

/** Each waiter gets what the node did with its own tokens. */
function answerRiding(riding: Riding[], result: CreditCompletion): void {
  const completed = new Set(result.completed);
  const refused = new Map(result.refused.map((r) => [r.token, r]));
  for (const r of riding) {
    r.resolve({ completed: r.tokens.filter((t) => completed.has(t)),
                refused: r.tokens.flatMap((t) => refused.has(t) ? [refused.get(t)!] : []) });
  }
}

function toTokens(tokens: Array<Lease | string> | Lease | string): string[] {
  return (Array.isArray(tokens) ? tokens : [tokens])
    .map((t) => (typeof t === "string" ? t : t.token));
}
