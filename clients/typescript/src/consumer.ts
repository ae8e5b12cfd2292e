import type { Client, QueueRecord } from "./client.js";

/** What `consume` runs for each record, in offset order. */
export type RecordHandler = (record: QueueRecord) => unknown | Promise<unknown>;

// An empty page that came back sooner than this (a node answering at once, e.g. while it
// stops) is followed by a pause, so the loop never spins.
const QUICK_EMPTY_MS = 50;
const MAX_PAUSE_MS = 1_000;

/**
 * Process the queue as `consumer` until `signal` aborts (or `maxRecords` were handled): a
 * long-poll, the handler for each record in offset order, and an ack of the page's
 * `nextOffset` once every record of it was handled (at-least-once), which also moves the
 * consumer past records that no longer exist. If a handler throws, the records before it are
 * acked and the error propagates; the failing record is read again by the next `consume`.
 * Resolves to the number of records handled. The same loop as the Python client's `consume`.
 */
export async function consume(client: Client, queue: string, consumer: string,
                              handler: RecordHandler, opts: {
                                limit?: number; waitMs?: number; signal?: AbortSignal;
                                maxRecords?: number;
                              } = {}): Promise<number> {
  let handled = 0;
  let position: number | undefined;  // the next offset to read, once known
  let acked: number | undefined;
  let pause = QUICK_EMPTY_MS;
  const more = () => !opts.signal?.aborted &&
    (opts.maxRecords === undefined || handled < opts.maxRecords);
  while (more()) {
    const started = Date.now();
    let page;
    try {
      page = await client.read(queue, { consumer, offset: position, limit: opts.limit ?? 100,
                                        waitMs: opts.waitMs ?? 20_000, signal: opts.signal });
    } catch (exc) {
      if (opts.signal?.aborted) break;
      throw exc;
    }
    if (!page.records.length) {
      if (page.nextOffset !== position && page.nextOffset !== acked) {
        await client.ack(queue, consumer, page.nextOffset);  // past a gap
        acked = page.nextOffset;
      } else if (Date.now() - started < QUICK_EMPTY_MS) {
        await new Promise((r) => setTimeout(r, pause));
        pause = Math.min(MAX_PAUSE_MS, pause * 2);
      }
      position = page.nextOffset;
      continue;
    }
    pause = QUICK_EMPTY_MS;
    let doneTo: number | undefined;
    try {
      let whole = true;
      for (const rec of page.records) {
        await handler(rec);
        doneTo = rec.offset + 1;
        handled += 1;
        if (opts.maxRecords !== undefined && handled >= opts.maxRecords) {
          whole = false;
          break;
        }
      }
      if (whole) doneTo = page.nextOffset;  // the whole page, gaps after its last record too
    } finally {
      if (doneTo !== undefined) {
        await client.ack(queue, consumer, doneTo);
        acked = position = doneTo;
      }
    }
  }
  return handled;
}
