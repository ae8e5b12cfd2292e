/**
 * Queue-to-partition routing, identical to the server's: Kafka's murmur2 partitioner
 * (Java's `Utils.murmur2`), masked to 31 bits as Kafka's default partitioner does (ADR 1).
 * Checked against the repository's vectors (tests/data/murmur2_vectors.json).
 */

const SEED = 0x9747b28c;
const M = 0x5bd1e995;
const utf8 = new TextEncoder();

/** Kafka's murmur2 of `data`, as an unsigned 32-bit integer. */
export function murmur2(data: Uint8Array): number {
  const length = data.length;
  let h = (SEED ^ length) | 0;
  const end = length - (length % 4);
  for (let i = 0; i < end; i += 4) {
    let k = data[i] | (data[i + 1] << 8) | (data[i + 2] << 16) | (data[i + 3] << 24);
    k = Math.imul(k, M);
    k ^= k >>> 24;
    k = Math.imul(k, M);
    h = Math.imul(h, M);
    h ^= k;
  }
  const rest = length % 4;
  if (rest === 3) h ^= data[end + 2] << 16;
  if (rest >= 2) h ^= data[end + 1] << 8;
  if (rest >= 1) {
    h ^= data[end];
    h = Math.imul(h, M);
  }
  h ^= h >>> 13;
  h = Math.imul(h, M);
  h ^= h >>> 15;
  return h >>> 0;
}

/** The data partition of `queue`: `(murmur2(utf8(queue)) & 0x7fffffff) % partitions`. */
export function partitionFor(queue: string, partitions: number): number {
  return (murmur2(utf8.encode(queue)) & 0x7fffffff) % partitions;
}
