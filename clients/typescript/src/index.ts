/** vqueues-client: a partition-aware client for vqueues. */
export {
  Client, DEFAULT_MAX_BATCH_RECORDS, DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_RECORD_BYTES, Lease,
  MAX_RIDING_TOKENS, QueueRecord, encodeRecord, sleep,
  type CallOptions, type ClientOptions, type ConsumerSettings, type EnqueueOptions,
  type EnqueueResult, type LeaseBatch, type LeaseOptions, type NewRecord,
  type PrefixLeaseBatch, type PrefixLeaseOptions, type ReadOptions, type ReadResult,
  type RecordResult, type Tokens, type Value,
} from "./client.js";
export {
  BadRequestError, ConflictError, DeadlineExceededError, ERROR_CODES, ForbiddenError,
  NotFoundError, RateLimitedError, RequestRefusedError, UnauthenticatedError, UnavailableError,
  VQError, WrongNodeError, errorFrom, type ErrorCode,
} from "./errors.js";
export { murmur2, partitionFor } from "./murmur2.js";
export { BatchProducer } from "./producer.js";
export { Worker, type Handler, type RefusedCompletion, type WorkerOptions } from "./worker.js";
export { Stream, type CreditCompletion, type StreamOptions } from "./stream.js";
export type {
  AckResult, ConsumerDeletion, ConsumerInfo, ConsumerSettingsInfo, NodeLimits, PartitionsInfo,
  PrefixRefusedToken, PrefixToken, QueueDeletion, QueueInfo, RefusedToken, ScheduledCancellation,
  SettleResult,
} from "./types.js";
export { SCHEMA_FIELDS } from "./types.js";
export { consume, type RecordHandler } from "./consumer.js";
