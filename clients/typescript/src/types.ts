/**
 * The node's answers, as it serves them (snake_case, as in its OpenAPI document). Written by
 * hand; `SCHEMA_FIELDS` lists each one's fields, and a test checks them against the OpenAPI
 * document a running node serves (test/client.test.ts), so a field added or renamed on the
 * server fails the client's suite.
 */

export interface AckResult {
  queue: string;
  consumer: string;
  offset: number;
  previous_offset: number | null;
}

export interface ConsumerInfo {
  consumer: string;
  offset: number;
  lag: number;
  mode?: string;
  in_flight?: number;
  delayed?: number;
  available?: number;
  dead_lettered?: number;
}

export interface QueueInfo {
  queue: string;
  partition: number;
  records: number;
  first_offset: number | null;
  last_offset: number | null;
  consumers: ConsumerInfo[];
  scheduled?: number;
  next_due?: number | null;
}

export interface ConsumerSettingsInfo {
  queue: string;
  consumer: string;
  mode: "cursor" | "lease";
  max_attempts: number;
  dead_letter_queue: string | null;
  visibility_ms: number;
  offset: number | null;
  max_in_flight?: number | null;
  prefix?: string | null;
  /** Leases answered only once their grants are written (false: written behind). */
  durable_grants?: boolean;
}

export interface SettleResult {
  queue: string;
  consumer: string;
  /** The tokens acted on. */
  done: string[];
  /** (retry) Tokens past max_attempts: sent to the dead letters. */
  dead_lettered: string[];
  /** The consumer's committed offset (low-water mark) after the call. */
  offset: number;
  /** (extend) The new lease deadline, UTC epoch ms. */
  deadline?: number | null;
}

/** A token a lease's `complete` did not complete, and why: `lease_expired` (not current; the
 * record comes again) or `invalid_token` (not a token). */
export interface RefusedToken {
  token: string;
  code: "lease_expired" | "invalid_token" | (string & {});
}

/** A prefix consumer's lease token: the queue it came from and the token. */
export interface PrefixToken {
  queue: string;
  token: string;
}

/** A `{queue, token}` a prefix lease's `complete` did not complete: `lease_expired`,
 * `invalid_token`, or `wrong_node` (the queue's partition is not served by the node the lease
 * went to: complete it with the queue's owner). */
export interface PrefixRefusedToken {
  queue: string;
  token: string;
  code: "lease_expired" | "invalid_token" | "wrong_node" | (string & {});
}

export interface QueueDeletion {
  queue: string;
  deleted: boolean;
  partition: number;
  records: number;
  consumers: string[];
  deleted_before: number;
}

export interface ConsumerDeletion {
  queue: string;
  consumer: string;
  deleted: boolean;
  offset: number;
}

export interface ScheduledCancellation {
  queue: string;
  id: number;
  cancelled: boolean;
}

/** The node's request limits a client sizes its requests by (its settings). */
export interface NodeLimits {
  max_body_bytes: number;
  max_batch_records: number;
  max_record_bytes: number;
}

export interface PartitionsInfo {
  partitions: number;
  generation: number;
  owners: Record<string, { node: string; url: string; generation?: number }>;
  node: string;
  url: string;
  owned: number[];
  ready: number[];
  limits: NodeLimits;
  details?: Array<Record<string, unknown>>;
  /** The layout `partitions` and `owners` describe: 0 until the cluster first grows, then
   * one more at each growth (docs/growing.md); a node older than growth sends none. */
  layout?: number;
}

/** Each answer's fields, checked against the OpenAPI document's schema of the same name. */
export const SCHEMA_FIELDS: Readonly<Record<string, readonly string[]>> = {
  AckResult: ["queue", "consumer", "offset", "previous_offset"],
  ConsumerInfo: ["consumer", "offset", "lag", "mode", "in_flight", "delayed", "available",
                 "dead_lettered"],
  QueueInfo: ["queue", "partition", "records", "first_offset", "last_offset", "consumers",
              "scheduled", "next_due"],
  ConsumerSettings: ["queue", "consumer", "mode", "max_attempts", "dead_letter_queue",
                     "visibility_ms", "offset", "max_in_flight", "prefix", "durable_grants"],
  SettleResult: ["queue", "consumer", "done", "dead_lettered", "offset", "deadline"],
  QueueDeletion: ["queue", "deleted", "partition", "records", "consumers", "deleted_before"],
  ConsumerDeletion: ["queue", "consumer", "deleted", "offset"],
  ScheduledCancellation: ["queue", "id", "cancelled"],
  PartitionsInfo: ["partitions", "generation", "owners", "node", "url", "owned", "ready",
                   "limits", "details", "layout"],
  NodeLimits: ["max_body_bytes", "max_batch_records", "max_record_bytes"],
};
