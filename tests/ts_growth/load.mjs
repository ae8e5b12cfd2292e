// One TypeScript client (clients/typescript, built) writing numbered records to queues and
// reading them back with a named consumer that acks, for tests/test_typescript_growth.py.
// argv: the built client's index.js, then the node URLs; VQ_QUEUES: the queues, comma-separated.
// Prints {"ready": true} once every queue has had a record written and read, then goes on
// until "stop" comes on stdin; then stops writing, reads until it has every acknowledged
// record, and prints what it wrote, read and routed with as one JSON line.
import { createInterface } from "node:readline";
import { pathToFileURL } from "node:url";

const [clientPath, ...urls] = process.argv.slice(2);
const { Client } = await import(pathToFileURL(clientPath).href);
const queues = process.env.VQ_QUEUES.split(",");
const vq = new Client(urls, { deadlineMs: 60_000 });
// What the nodes answered (status, or the transport error's code), counted by the client's
// transport: the test checks the growth was met (a 503, a refused connection), not slept through.
const met = {};
const request = vq.transport.request.bind(vq.transport);
vq.transport.request = async (...args) => {
  try {
    const answer = await request(...args);
    const code = answer.body?.error?.code;
    const key = answer.status < 300 ? String(answer.status) : `${answer.status} ${code}`;
    met[key] = (met[key] ?? 0) + 1;
    return answer;
  } catch (exc) {
    met[exc.code ?? exc.message] = (met[exc.code ?? exc.message] ?? 0) + 1;
    throw exc;
  }
};
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

let stopping = false;
let writersDone = false;
createInterface({ input: process.stdin }).on("line", (line) => {
  if (line.trim() === "stop") stopping = true;
});

const state = Object.fromEntries(queues.map((q) => [q, { acked: [], answers: [], seen: [] }]));

async function write(queue) {
  const s = state[queue];
  for (let i = 0; !stopping; i++) {
    // The key makes a retry after a lost answer (a node closing its port) write nothing twice.
    const answer = await vq.enqueue(queue, String(i), { idempotencyKey: `${queue}:${i}` });
    s.acked.push(i);
    s.answers.push([i, answer.partition, answer.offsets[0]]);
    await sleep(20);
  }
}

async function read(queue) {
  const s = state[queue];
  while (!(stopping && s.seen.length >= s.acked.length && writersDone)) {
    const page = await vq.read(queue, { consumer: "c", limit: 50, waitMs: 200 });
    for (const rec of page.records) s.seen.push(Number(rec.text));
    if (page.records.length) await vq.ack(queue, "c", page.nextOffset);
  }
}

const writers = Promise.all(queues.map(write)).then(() => { writersDone = true; });
const readers = Promise.all(queues.map(read));
while (!queues.every((q) => state[q].seen.length > 0)) await sleep(50);
process.stdout.write(JSON.stringify({ ready: true }) + "\n");
await writers;
await readers;
const routed = Object.fromEntries(queues.map((q) => [q, vq.cachedOwner(q)]));
process.stdout.write(JSON.stringify({
  partitions: vq.partitions,
  owners: Object.fromEntries(vq.owners),
  routed,
  met,
  queues: state,
}) + "\n", () => process.exit(0));  // exit once written: stdin would keep the process
vq.close();
