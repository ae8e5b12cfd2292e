import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import * as path from "node:path";
import { test } from "node:test";

import { partitionFor } from "../src/index.js";
import { REPO } from "./cluster.js";

test("routing matches Kafka's murmur2 partitioner on the repository's vectors", () => {
  const vectors = JSON.parse(readFileSync(path.join(REPO, "tests", "data",
                                                    "murmur2_vectors.json"), "utf8"));
  let checked = 0;
  for (const c of vectors.cases as Array<{ queue: string; partitions: Record<string, number> }>) {
    for (const [n, expected] of Object.entries(c.partitions)) {
      assert.equal(partitionFor(c.queue, Number(n)), expected, `${c.queue} over ${n}`);
      checked++;
    }
  }
  assert.ok(checked > 50, `only ${checked} vectors`);
});
