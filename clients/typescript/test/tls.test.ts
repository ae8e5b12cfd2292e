/** Auth and TLS: a node serving HTTPS with a private CA and bearer tokens, started by the
 * repository's tests/test_typescript_client.py, which passes its URL, CA and a token. */
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { test } from "node:test";

import {
  Client, ForbiddenError, UnauthenticatedError, VQError,
} from "../src/index.js";

const url = process.env.VQ_TS_TLS_URL;
const skip = url ? false : "needs a TLS node with auth: run through tests/test_typescript_client.py";

test("a token and a private CA: calls pass; without them, typed refusals", { skip }, async () => {
  const ca = readFileSync(process.env.VQ_TS_CA!);
  const token = process.env.VQ_TS_TOKEN!;
  const vq = new Client(url!, { token, ca });
  try {
    const res = await vq.enqueue("ts/secure", "over https");
    const page = await vq.read("ts/secure", { offset: res.offsets![0] });
    assert.deepEqual(page.records.map((r) => r.text), ["over https"]);
    await assert.rejects(vq.enqueue("other/queue", "no scope"),
                         (e: ForbiddenError) => e instanceof ForbiddenError && e.status === 403);
  } finally {
    vq.close();
  }
  const anonymous = new Client(url!, { ca });
  try {
    await assert.rejects(anonymous.refreshMap(),
                         (e: UnauthenticatedError) => e instanceof UnauthenticatedError);
  } finally {
    anonymous.close();
  }
  const untrusting = new Client(url!, { token, deadlineMs: 200 });  // the system's CAs only
  try {
    await assert.rejects(untrusting.refreshMap(), (e: VQError) => e instanceof VQError &&
                           e.code === "no_node_reachable" && /certificate/i.test(e.message));
  } finally {
    untrusting.close();
  }
});
