/** The TypeScript client's figures for scripts/bench_clients.py: enqueue throughput (100-record
 * batches, `concurrency` in flight, for `seconds`), enqueue -> a long-polling reader (p50,
 * p99, ms) and a `Worker` (16 slots, a no-op handler) draining `workerRecords` records over 10
 * queues, printed as one JSON line.
 * Usage: node dist/bench/bench.js URL [seconds] [concurrency] [samples] [workerRecords] */
import { Client, Worker } from "../src/index.js";

const [url, seconds = "4", concurrency = "16", samples = "200", workerRecords = "50000"] =
  process.argv.slice(2);
const vq = new Client(url);
const batch = Array.from({ length: 100 }, () => "x".repeat(100));

async function throughput(): Promise<number> {
  let records = 0;
  const until = Date.now() + Number(seconds) * 1000;
  const started = performance.now();
  await Promise.all(Array.from({ length: Number(concurrency) }, async (_, i) => {
    while (Date.now() < until) {
      await vq.enqueue(`tsb-${i % 10}`, batch);
      records += batch.length;
    }
  }));
  return records / ((performance.now() - started) / 1000);
}

async function endToEnd(): Promise<number[]> {
  const q = `tse2e-${Math.random().toString(36).slice(2, 8)}`;
  let next = (await vq.read(q)).nextOffset;
  const out: number[] = [];
  for (let n = 0; n < Number(samples); n++) {
    const reader = vq.read(q, { offset: next, waitMs: 5000 });
    await new Promise((r) => setTimeout(r, 5));  // the reader is parked in its long poll
    const t0 = performance.now();
    const [page] = await Promise.all([reader, vq.enqueue(q, "x".repeat(100))]);
    out.push(performance.now() - t0);
    next = page.nextOffset;
  }
  return out.sort((a, b) => a - b);
}

async function workerDrain(): Promise<number> {
  const total = Number(workerRecords);
  const tag = Math.random().toString(36).slice(2, 8);
  const names = Array.from({ length: 10 }, (_, i) => `tsw-${tag}-${i}`);
  const fill = Array.from({ length: 500 }, () => "x".repeat(100));
  for (const q of names) {
    for (let n = 0; n < total / 10; n += fill.length) await vq.enqueue(q, fill);
  }
  let done = 0;
  const started = performance.now();
  const worker = new Worker(vq, names, "bench", () => { done += 1; },
                            { concurrency: 16, waitMs: 200 }).start();
  while (done < total) await new Promise((r) => setTimeout(r, 5));
  const rate = done / ((performance.now() - started) / 1000);
  await worker.stop();
  return rate;
}

await vq.refreshMap();
await vq.enqueue("tsb-warm", batch);
const rate = await throughput();
const e2e = await endToEnd();
const pct = (p: number) => e2e[Math.min(e2e.length - 1, Math.floor(e2e.length * p))];
const drained = Number(workerRecords) > 0 ? await workerDrain() : 0;
console.log(JSON.stringify({ throughput: rate, e2e_p50: pct(0.5), e2e_p99: pct(0.99),
                             worker: drained }));
vq.close();
