import type { Client, Lease, QueueRecord } from "./client.js";
import { VQError, errorFrom } from "./errors.js";

export interface StreamOptions {
  /** lease or cursor; the consumer's own mode when unset. */
  mode?: "lease" | "cursor";
  visibilityMs?: number;
  tag?: string;
  /** Records the node may send ahead of those taken from the stream (100; at most 10,000). */
  credit?: number;
  signal?: AbortSignal;
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
 * ahead. In lease mode settle with `complete`, `retry`, `extend`; in cursor mode `ack`. Each op
 * resolves to its HTTP route's answer, or rejects with the node's error. Needs the `ws` package
 * (an optional dependency: Node 20 has no WebSocket of its own).
 */
export class Stream implements AsyncIterable<Lease | QueueRecord> {
  private readonly buffered: Array<Lease | QueueRecord> = [];
  private readonly ops = new Map<number, { resolve: (v: Json) => void;
                                            reject: (e: VQError) => void }>();
  private waiter: (() => void) | null = null;
  private ended: VQError | null | undefined = undefined;  // null: closed cleanly
  private nextId = 1;

  private constructor(private readonly socket: Socket, private readonly decode: Decoder) {
    socket.on("message", (data) => this.onFrame(JSON.parse(data.toString("utf8")) as Json));
    socket.on("close", () => this.finish(null));
    socket.on("error", (err) => this.finish(
      new VQError(0, "connection_error", err.message, {}, true)));
  }

  /** Open a stream on `url` (the queue's owner); `decode` turns a frame's record into a Lease
   * or a record. */
  static async open(client: Client, url: string, headers: Record<string, string>,
                    decode: Decoder, credit: number, signal?: AbortSignal): Promise<Stream> {
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
    const stream = new Stream(socket, decode);
    signal?.addEventListener("abort", () => stream.close(), { once: true });
    stream.credit(credit);
    return stream;
  }

  /** Let the node send `n` more records. */
  credit(n: number): void {
    if (n > 0 && this.ended === undefined) this.socket.send(JSON.stringify({ op: "credit", n }));
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
      if (frame.id === undefined || frame.id === null) {
        this.finish(err);
      } else {
        const op = this.ops.get(frame.id as number);
        this.ops.delete(frame.id as number);
        op?.reject(err);
      }
    }
  }

  private finish(err: VQError | null): void {
    if (this.ended !== undefined) return;
    this.ended = err;
    for (const op of this.ops.values()) {
      op.reject(err ?? new VQError(0, "connection_error", "stream closed", {}, true));
    }
    this.ops.clear();
    this.wake();
  }

  private wake(): void {
    const w = this.waiter;
    this.waiter = null;
    w?.();
  }
}

function toTokens(tokens: Array<Lease | string> | Lease | string): string[] {
  return (Array.isArray(tokens) ? tokens : [tokens])
    .map((t) => (typeof t === "string" ? t : t.token));
}
