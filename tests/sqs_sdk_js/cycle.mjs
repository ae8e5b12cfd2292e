// The AWS SDK for JavaScript v3 against vqueues' SQS API (run by tests/test_sqs_javascript.py
// with SQS_ENDPOINT set): the full cycle, with the SDK's MD5 checks of bodies on (it refuses an
// answer whose MD5OfMessageBody or MD5s of a batch are wrong) and the attributes' digests
// computed here by AWS's documented algorithm. Exits non-zero, naming the step, on a failure.
import { createHash } from "node:crypto";
import assert from "node:assert/strict";
import {
  SQSClient, CreateQueueCommand, GetQueueAttributesCommand, SendMessageCommand,
  SendMessageBatchCommand, ReceiveMessageCommand, DeleteMessageCommand,
  DeleteMessageBatchCommand, ChangeMessageVisibilityCommand, ListQueuesCommand,
  GetQueueUrlCommand, DeleteQueueCommand,
} from "@aws-sdk/client-sqs";

const sqs = new SQSClient({
  endpoint: process.env.SQS_ENDPOINT, region: "us-east-1", maxAttempts: 1,
  credentials: { accessKeyId: "x", secretAccessKey: "x" },
});
const tag = Math.random().toString(36).slice(2, 10);
const send = (cmd) => sqs.send(cmd);

function field(bytes) {
  const len = Buffer.alloc(4);
  len.writeUInt32BE(bytes.length);
  return Buffer.concat([len, bytes]);
}

// MD5OfMessageAttributes: each attribute by name: name, type, transport byte, value.
function attributesMd5(attrs) {
  const hash = createHash("md5");
  for (const name of Object.keys(attrs).sort()) {
    const a = attrs[name];
    const binary = a.DataType.startsWith("Binary");
    hash.update(field(Buffer.from(name, "utf8")));
    hash.update(field(Buffer.from(a.DataType, "utf8")));
    hash.update(Buffer.from([binary ? 2 : 1]));
    hash.update(field(binary ? Buffer.from(a.BinaryValue) : Buffer.from(a.StringValue, "utf8")));
  }
  return hash.digest("hex");
}

const steps = [];
async function step(name, fn) {
  try {
    await fn();
    steps.push(name);
  } catch (err) {
    console.error(`step ${name} failed:`, err);
    process.exit(1);
  }
}

let url, dead;
await step("create", async () => {
  dead = (await send(new CreateQueueCommand({ QueueName: `js-dead-${tag}` }))).QueueUrl;
  const deadArn = (await send(new GetQueueAttributesCommand({
    QueueUrl: dead, AttributeNames: ["QueueArn"] }))).Attributes.QueueArn;
  url = (await send(new CreateQueueCommand({ QueueName: `js-${tag}`, Attributes: {
    VisibilityTimeout: "30",
    RedrivePolicy: JSON.stringify({ deadLetterTargetArn: deadArn, maxReceiveCount: 2 }) },
  }))).QueueUrl;
  assert.equal((await send(new GetQueueUrlCommand({ QueueName: `js-${tag}` }))).QueueUrl, url);
  const listed = await send(new ListQueuesCommand({ QueueNamePrefix: `js-${tag}` }));
  assert.deepEqual(listed.QueueUrls, [url]);
});

const attrs = {
  text: { DataType: "String", StringValue: "héllo ✓" },
  count: { DataType: "Number", StringValue: "12.5" },
  blob: { DataType: "Binary", BinaryValue: new Uint8Array([0, 1, 2, 255]) },
};
let sentId;
await step("send", async () => {
  const sent = await send(new SendMessageCommand({
    QueueUrl: url, MessageBody: "body ✓", MessageAttributes: attrs }));
  assert.equal(sent.MD5OfMessageAttributes, attributesMd5(attrs));
  sentId = sent.MessageId;
});

await step("batch send", async () => {
  const out = await send(new SendMessageBatchCommand({ QueueUrl: url, Entries: [
    { Id: "a", MessageBody: "one" }, { Id: "b", MessageBody: "two", MessageAttributes: attrs },
  ] }));
  assert.deepEqual(out.Successful.map((e) => e.Id).sort(), ["a", "b"]);
  assert.equal(out.Successful.find((e) => e.Id === "b").MD5OfMessageAttributes,
    attributesMd5(attrs));
});

let first;
await step("long-poll receive", async () => {
  const got = await send(new ReceiveMessageCommand({
    QueueUrl: url, MaxNumberOfMessages: 10, WaitTimeSeconds: 2, MessageAttributeNames: ["All"],
    MessageSystemAttributeNames: ["All"] }));
  assert.equal(got.Messages.length, 3);
  for (const m of got.Messages) {
    assert.equal(m.Attributes.ApproximateReceiveCount, "1");
    if (m.MessageAttributes) {
      assert.equal(m.MD5OfMessageAttributes, attributesMd5(m.MessageAttributes));
    }
  }
  first = got.Messages.find((m) => m.MessageId === sentId);
  assert.equal(first.Body, "body ✓");
  assert.equal(first.MessageAttributes.text.StringValue, "héllo ✓");
  assert.deepEqual([...first.MessageAttributes.blob.BinaryValue], [0, 1, 2, 255]);
  for (const m of got.Messages.filter((m) => m !== first)) {
    await send(new DeleteMessageCommand({ QueueUrl: url, ReceiptHandle: m.ReceiptHandle }));
  }
});

await step("change visibility", async () => {
  await send(new ChangeMessageVisibilityCommand({
    QueueUrl: url, ReceiptHandle: first.ReceiptHandle, VisibilityTimeout: 0 }));
  const again = await send(new ReceiveMessageCommand({
    QueueUrl: url, WaitTimeSeconds: 2, MessageSystemAttributeNames: ["ApproximateReceiveCount"],
    VisibilityTimeout: 0 }));
  assert.equal(again.Messages[0].MessageId, sentId);
  assert.equal(again.Messages[0].Attributes.ApproximateReceiveCount, "2");
});

await step("redrive", async () => {
  // received twice (maxReceiveCount 2): when this lease runs out it goes to the dead letters
  const moved = await send(new ReceiveMessageCommand({
    QueueUrl: dead, WaitTimeSeconds: 10, MessageAttributeNames: ["All"] }));
  assert.equal(moved.Messages[0].MessageId, sentId);
  assert.equal(moved.Messages[0].MD5OfMessageAttributes, attributesMd5(attrs));
  await send(new DeleteMessageBatchCommand({ QueueUrl: dead, Entries: [
    { Id: "x", ReceiptHandle: moved.Messages[0].ReceiptHandle }] }));
});

await step("fifo groups and deduplication", async () => {
  const fifo = (await send(new CreateQueueCommand({ QueueName: `js-${tag}.fifo`,
    Attributes: { FifoQueue: "true" } }))).QueueUrl;
  const ids = [];
  for (const [body, group] of [["a1", "a"], ["b1", "b"], ["a2", "a"]]) {
    const out = await send(new SendMessageCommand({ QueueUrl: fifo, MessageBody: body,
      MessageGroupId: group, MessageDeduplicationId: `d-${body}` }));
    ids.push(out.MessageId);
  }
  const dup = await send(new SendMessageCommand({ QueueUrl: fifo, MessageBody: "other",
    MessageGroupId: "a", MessageDeduplicationId: "d-a1" }));
  assert.equal(dup.MessageId, ids[0]);
  const order = [];
  while (order.length < 3) {
    const got = await send(new ReceiveMessageCommand({ QueueUrl: fifo, MaxNumberOfMessages: 10,
      WaitTimeSeconds: 1 }));
    for (const m of got.Messages ?? []) {
      order.push(m.Body);
      await send(new DeleteMessageCommand({ QueueUrl: fifo, ReceiptHandle: m.ReceiptHandle }));
    }
  }
  assert.ok(order.indexOf("a1") < order.indexOf("a2"));
  assert.deepEqual([...order].sort(), ["a1", "a2", "b1"]);
});

await step("errors", async () => {
  await assert.rejects(send(new GetQueueUrlCommand({ QueueName: `js-none-${tag}` })),
    (err) => err.name === "QueueDoesNotExist");
  await send(new DeleteQueueCommand({ QueueUrl: url }));
});

console.log(JSON.stringify({ ok: true, steps }));
