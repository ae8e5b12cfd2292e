import { ERROR_CODES, type ErrorCode } from "./codes.js";

export { ERROR_CODES, type ErrorCode };

/**
 * An error answer from a node (`{"error": {"code", "message", "retriable", ...}}`), or a
 * transport failure (`status` 0, code `connection_error`, retriable). `retriable` is the
 * server's own flag (its error registry decides).
 */
export class VQError extends Error {
  readonly status: number;
  readonly code: ErrorCode | "connection_error" | "deadline_exceeded" | "http_error" |
    "no_node_reachable";
  readonly retriable: boolean;
  readonly details: Record<string, unknown>;

  constructor(status: number, code: VQError["code"], message: string,
              details: Record<string, unknown> = {}, retriable = false) {
    super(`${status} ${code}: ${message}`);
    this.name = new.target.name;
    this.status = status;
    this.code = code;
    this.retriable = retriable;
    this.details = details;
  }
}

/** 400: the request is wrong; retrying it unchanged cannot succeed. */
export class BadRequestError extends VQError {}
/** 401: auth is on and the request had no valid bearer token. */
export class UnauthenticatedError extends VQError {}
/** 403: the token has no scope for this call on this queue. */
export class ForbiddenError extends VQError {}
/** 404: no such queue, consumer, scheduled record or route. */
export class NotFoundError extends VQError {}
/** 409: a conflict (`wrong_node`, `lease_expired`, `idempotency_key_reused`, ...). */
export class ConflictError extends VQError {}
/** 409 `wrong_node`: another node owns the queue's partition (`owner`, `ownerNode`). */
export class WrongNodeError extends ConflictError {
  get owner(): string | undefined { return this.details.owner as string | undefined; }
  get ownerNode(): string | undefined { return this.details.owner_node as string | undefined; }
}
/** 408, 413, 415: the body came too slowly, too large, or in a form the node does not take. */
export class RequestRefusedError extends VQError {}
/** 429: a quota is used up; retry after `retryAfterMs`. */
export class RateLimitedError extends VQError {}
/** 5xx: the node cannot serve now (a partition replaying or moving, the broker). */
export class UnavailableError extends VQError {}
/** Retries did not succeed within the call's deadline; `last` is the last error seen. */
export class DeadlineExceededError extends VQError {
  readonly last: VQError | undefined;
  constructor(last: VQError | undefined) {
    super(last?.status ?? 0, "deadline_exceeded", `gave up after retries; last error: ${last}`,
          {}, false);
    this.last = last;
  }
}

/** The typed error a node's error answer stands for. */
export function errorFrom(status: number, body: unknown, reason = ""): VQError {
  const err = (typeof body === "object" && body !== null && "error" in body &&
    typeof (body as { error: unknown }).error === "object" ?
    (body as { error: Record<string, unknown> }).error : {}) as Record<string, unknown>;
  const code = (typeof err.code === "string" ? err.code : "http_error") as VQError["code"];
  const message = typeof err.message === "string" ? err.message : reason;
  const retriable = err.retriable === true;
  const args = [status, code, message, err, retriable] as const;
  if (code === "wrong_node") return new WrongNodeError(...args);
  if (status === 400) return new BadRequestError(...args);
  if (status === 401) return new UnauthenticatedError(...args);
  if (status === 403) return new ForbiddenError(...args);
  if (status === 404) return new NotFoundError(...args);
  if (status === 409) return new ConflictError(...args);
  if (status === 408 || status === 413 || status === 415) return new RequestRefusedError(...args);
  if (status === 429) return new RateLimitedError(...args);
  if (status >= 500) return new UnavailableError(...args);
  return new VQError(...args);
}
