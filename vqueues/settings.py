"""The node's settings: one frozen object, filled once from CLI flags and `VQ_*` variables.

Precedence: command-line flag, then the `VQ_<FIELD>` environment variable, then the default
written next to each field. `docs/configuration.md` lists them all (generated from this file's
help texts by `vqueues serve --help`).
"""

from __future__ import annotations

import argparse
import os
import socket
import ssl
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

MIN_VISIBILITY_MS = 100  # shortest lease: anything shorter expires before a worker can act
# producer_busy_linger_ms "auto": librdkafka sends a produce request per partition and Kafka's
# brokers pay per request, so a longer linger pays there; on tansu, whose round trip is short,
# it gains nothing and slows few requests in flight (ADR 6 has the figures).
BUSY_LINGER_EMBEDDED_MS = 2
BUSY_LINGER_KAFKA_MS = 5
# tail_pace_ms "auto": a tansu fetch costs it the same whatever it returns, so a tail fetching
# back to back behind the node's own single writes keeps it busy; pausing after a batch of own
# writes frees it (ADR 6). Kafka's fetches are cheap: no pause.
TAIL_PACE_EMBEDDED_MS = 20
TAIL_PACE_KAFKA_MS = 0


def _auto_ms(value: str, embedded: bool, on_embedded: int, on_others: int) -> int:
    """A setting of "auto" (a default per broker) or a whole number of ms (checked)."""
    if value == "auto":
        return on_embedded if embedded else on_others
    return int(value)


def _f(default: Any, help: str, **kw: Any) -> Any:
    return field(default=default, metadata={"help": help, **kw})


@dataclass(frozen=True)
class Settings:
    """Everything a node needs; see each field's help for its meaning and default."""

    bootstrap: str = _f("127.0.0.1:9092", "Kafka bootstrap servers (host:port[,host:port])")
    http_host: str = _f("127.0.0.1", "address the HTTP server binds to")
    http_port: int = _f(8080, "HTTP port")
    node_id: str = _f("", "this node's id (default: <hostname>-<http_port>)")
    advertised_url: str = _f("", "URL clients use to reach this node (default: http://host:port)")
    data_topic: str = _f("vq-data", "topic holding the queues' records")
    offset_topic: str = _f("vq-offsets", "compacted topic holding consumer offsets and deletions")
    assignment_topic: str = _f("vq-assignments", "single-partition topic of partition owners")
    snapshot_topic: str = _f(
        "vq-snapshots", "compacted topic of partition snapshots (same partition count as the "
        "data topic); if it does not exist the node runs without snapshots, saying so")
    topic_wait_ms: int = _f(
        30_000, "how long a starting node waits for its data, offset and assignment topics "
        "(and a grown layout's) to appear in the brokers' metadata before it exits with status "
        "3 naming those still missing (it logs `topics_waiting` meanwhile): a broker lists a "
        "topic created a moment before, by `vqueues topics create` or another process, a "
        "little after the controller made it. Wrong partition counts among topics that all "
        "exist stop it at once; a signal ends the wait (the node stops); 0: no wait")
    compacted_segment_bytes: int = _f(
        100 * 1024 * 1024, "segment.bytes of the offset, snapshot and assignment topics, set by "
        "`vqueues topics create` (also on existing topics): compaction never touches a "
        "partition's active segment, so it holds up to this much before anything of it is "
        "compacted (Kafka's default is 1 GiB; 100 MiB is __consumer_offsets'); at least 1 MiB, "
        "Kafka's minimum. docs/kafka.md gives the size bound")
    compacted_segment_ms: int = _f(
        3_600_000, "segment.ms of the compacted topics (as compacted_segment_bytes): the first "
        "write to a partition whose active segment is this old rolls it, which makes the old "
        "one compactable (Kafka's default is 7 days)")
    compacted_delete_retention_ms: int = _f(
        3_600_000, "delete.retention.ms of the compacted topics (as compacted_segment_bytes): "
        "how long a tombstone outlives the cleaning that removed the records it deletes; keep "
        "it well above the longest replay of an offset or snapshot partition, which could "
        "otherwise read a record and miss its tombstone (Kafka's default is 1 day)")
    snapshot_interval_s: int = _f(
        300, "how often a node considers writing a snapshot of each owned partition")
    snapshot_on_stop: bool = _f(
        True, "a node stopped with SIGTERM first snapshots each partition that took in at "
        "least 1,000 records since its last snapshot (10 s at most), so that whoever serves it "
        "next, the node itself restarted in place included, loads instead of replaying")
    snapshot_min_records: int = _f(
        100_000, "a partition is snapshotted only once this many records arrived since its "
        "last snapshot (takeover replays at most about this many, plus the interval's)")
    group_id: str = _f("vq-nodes", "Kafka consumer group the nodes form over the data topic")
    session_timeout_ms: int = _f(10000, "group session timeout (Kafka's session.timeout.ms)")
    heartbeat_interval_ms: int = _f(1000, "group heartbeat interval (heartbeat.interval.ms)")
    static_membership: str = _f(
        "auto", "join the group as a static member (Kafka's group.instance.id = node_id, "
        "KIP-345): a node restarted within session_timeout_ms gets its partitions back without "
        "a rebalance, but one stopped for good holds them until the session times out. A "
        "member fenced by its own earlier incarnation (FENCED_INSTANCE_ID, as after a restart "
        "of every broker) makes a new consumer and joins again. auto: on, except on the "
        "embedded broker (tansu), whose coordinator does not give a restarted static member its "
        "partitions back", choices=("auto", "on", "off"))
    self_fence_ms: int = _f(
        2000, "a node that stood still longer than this (a pause: SIGSTOP, a frozen VM) refuses "
        "offset-topic writes (acks, leases, settles, consumer changes) with 503 until the group "
        "coordinator confirms it still owns its partitions; must be below session_timeout_ms "
        "minus heartbeat_interval_ms; 0: off")
    fetch_wait_max_ms: int = _f(
        100, "longest the tail's fetch waits for data (fetch.wait.max.ms). The node's own "
        "writes never wait for it (ADR 6); it bounds idle fetch traffic, and on brokers that hold "
        "an empty fetch (tansu) how soon other producers' records appear")
    tail_pace_ms: str = _f(
        "auto", "after the tail's fetch brought only records this node wrote (indexed already, "
        "ADR 6), it pauses this long, in ms: fewer fetches of the node's own writes; other "
        "producers' records may appear up to this much later. auto: 20 on the embedded broker "
        "(tansu), whose fetch costs it the same whatever it returns, and 0 on any other")
    broker_timeout_ms: int = _f(
        10_000, "longest a request waits on the brokers: a write they have not acknowledged "
        "in this time (librdkafka's message.timeout.ms) and a read of records older than the "
        "cache not fetched in this time answer 503 broker_timeout (retriable); a write that "
        "timed out may still be stored (at-least-once, as any retried write)")
    producer_acks: str = _f("all", "acks for enqueued records: all, 1 or 0 (0: offsets unknown)",
                            choices=("all", "1", "0"))
    producer_linger_ms: int = _f(
        0, "producer batching delay (linger.ms) for a write to an idle node; 0 sends at once")
    producer_busy_linger_ms: str = _f(
        "auto", "batching delay (linger.ms) for a write made while other writes are in "
        "flight, in ms: such writes go through a second producer so that they share produce "
        "requests (fewer requests, less CPU in the node and the broker); no larger than "
        "producer_linger_ms turns it off. auto: 2 on the embedded broker (tansu), whose "
        "round trip is short, and 5 on any other (Kafka's own linger.ms default), where "
        "larger requests cost the brokers half the CPU per record")
    cache_max_bytes: int = _f(256 * 1024 * 1024, "recent-record cache size in bytes, node-wide")
    fetchers: int = _f(4, "Kafka consumers kept for reading records older than the cache")
    max_body_bytes: int = _f(16 * 1024 * 1024, "largest accepted HTTP request body")
    body_timeout_ms: int = _f(
        10_000, "longest a request body may take to arrive once its headers have; a slower "
        "one gets 408 request_timeout and its connection is closed")
    max_batch_records: int = _f(1000, "most records in one enqueue request")
    max_record_bytes: int = _f(1024 * 1024, "largest record value (decoded bytes)")
    default_read_limit: int = _f(100, "records returned by a read when `limit` is not given")
    max_read_limit: int = _f(1000, "largest `limit` a read accepts")
    max_read_bytes: int = _f(
        8 * 1024 * 1024, "a read stops adding records past this many value bytes (at least one)")
    max_wait_ms: int = _f(30000, "largest `wait_ms` a read accepts")
    max_list_queues: int = _f(10000, "largest `limit` of GET /v1/queues")
    write_visible_timeout_ms: int = _f(
        2000, "an enqueue waits this long for its records to be readable before answering")
    retention_check_s: int = _f(
        60, "how often a node reads each owned partition's log start offset, drops the index "
        "entries retention removed, and expires idle consumers")
    consumer_retention_ms: int = _f(
        7 * 24 * 3600 * 1000, "a consumer that has not acked for this long is removed (a "
        "tombstone in the offset topic), like Kafka's offsets.retention.minutes; 0 keeps them. "
        "An SQS queue's consumer never expires (docs/sqs.md)")
    idempotency_window_ms: int = _f(
        600_000, "an enqueue whose record carries an idempotency key already seen for its queue "
        "within this window writes nothing and answers the first record's offset (0: off)")
    max_schedule_delay_ms: int = _f(
        7 * 24 * 3600 * 1000, "longest deliver_at/delay_ms ahead of now (7 days, Kafka's default "
        "retention): keep it below the data topic's retention.ms, which would delete a scheduled "
        "record before its time")
    scheduler_tick_ms: int = _f(
        20, "the longest a node waits between looks at its scheduled records: each is moved at "
        "its due time (within 5 ms) plus one write, a record scheduled less than this ahead up to "
        "this late")
    default_visibility_ms: int = _f(
        30000, "a lease consumer's lease length when neither the consumer's settings nor the "
        "lease call give one (SQS's visibility timeout)")
    max_visibility_ms: int = _f(43_200_000, "longest lease (visibility_ms) accepted: 12 h")
    default_max_attempts: int = _f(
        5, "deliveries of a record before it goes to the dead letters, when the consumer's "
        "settings do not say")
    max_lease_records: int = _f(1000, "largest `max_records` a lease accepts")
    max_lease_window: int = _f(
        100_000, "per lease consumer and queue: most records from the low-water mark to the "
        "last one handed out (in flight, waiting for a retry, or completed out of order); "
        "beyond it leasing waits (SQS allows 120,000 in flight per queue)")
    max_retry_delay_ms: int = _f(43_200_000, "longest `delay_ms` of a retry: 12 h")
    auth: bool = _f(False, "require a bearer token on every API call (docs/security.md); needs "
                    "auth_token_file or a JWT key")
    auth_token_file: str = _f("", "JSON token file: {\"tokens\": [{\"name\", \"sha256\", "
                              "\"scopes\"}]}, reloaded when it changes")
    auth_jwt_secret: str = _f("", "shared secret for HS256 JWTs")
    auth_jwt_public_key: str = _f("", "PEM file of the public key for RS256/ES256 JWTs")
    auth_jwt_audience: str = _f("", "if set, JWTs must carry this `aud`")
    auth_jwt_allow_no_exp: bool = _f(
        False, "accept JWTs without an `exp` claim (they never expire); by default they are "
        "refused with 401")
    metrics_auth: bool = _f(False, "with auth on, /metrics needs a valid token too")
    quota_file: str = _f(
        "", "JSON file of per-tenant enqueue quotas: {\"quotas\": [{\"prefix\", "
        "\"records_per_s\", \"bytes_per_s\", \"burst_s\"}]} (docs/security.md), reloaded "
        "when it changes; empty: no quotas")
    tls_cert: str = _f("", "PEM certificate (chain) file: with tls_key, the node serves HTTPS and "
                       "advertises https:// URLs")
    tls_key: str = _f("", "PEM private key file of tls_cert")
    tls_ca_file: str = _f("", "PEM CA bundle a node trusts when it forwards a request to "
                          "another node over HTTPS (default: the system's CAs)")
    forward: bool = _f(False, "proxy a request for a partition another node owns to that node "
                       "(for clients that cannot route) instead of answering 409")
    sqs_endpoint_url: str = _f(
        "", "the SQS API's endpoint in queue URLs ({endpoint}/{account}/{queue}, docs/sqs.md); "
        "give the same one (a load balancer's) to every node. Default: the scheme and Host of "
        "each request")
    sqs_account_id: str = _f("000000000000", "the account id in SQS queue URLs and ARNs "
                             "(12 digits)")
    sqs_region: str = _f("us-east-1", "the region in SQS queue ARNs")
    sqs_access_key_file: str = _f(
        "", "with auth on: the SQS API's access keys (JSON: id, secret, name, scopes; the file "
        "only its owner may read), against which SigV4 signatures are verified; reloaded when "
        "it changes. Without it, auth on refuses every SQS call (docs/sqs.md)")
    kafka_options: str = _f(
        "", "extra librdkafka settings for every client, comma-separated key=value "
        "(e.g. security.protocol=SASL_SSL,sasl.mechanism=PLAIN)")
    event_loop: str = _f("uvloop", "event loop: uvloop (lower latency; asyncio's if it is not "
                         "installed) or asyncio", choices=("uvloop", "asyncio"))
    malloc_arena_max: int = _f(
        2, "glibc malloc arenas (0: glibc's default of 8 per core); fewer keep resident memory "
        "close to live memory")
    gc_young_threshold: int = _f(
        20000, "allocations between young garbage collections (Python's default is 700); "
        "fewer collections under load. Objects alive at start are frozen out of collections")
    gc_freeze_objects: int = _f(
        50_000, "objects the garbage collector may track beyond the fewest it tracked since "
        "the last freeze (requests in flight come and go; queues created since the start stay) "
        "before they are collected once and frozen out of later collections, which would "
        "otherwise scan them again and again (150 ms for 200,000 in a node creating queues); "
        "0: never")
    log_level: str = _f("info", "log level", choices=("debug", "info", "warning", "error"))
    log_format: str = _f("json", "log line format", choices=("json", "text"))

    # Derived values -------------------------------------------------------------------------

    @property
    def effective_node_id(self) -> str:
        return self.node_id or f"{socket.gethostname()}-{self.http_port}"

    @property
    def effective_url(self) -> str:
        if self.advertised_url:
            return self.advertised_url.rstrip("/")
        host = self.http_host
        if host in ("0.0.0.0", "::", ""):
            host = "127.0.0.1"
        if ":" in host:
            host = f"[{host}]"
        scheme = "https" if self.tls_cert else "http"
        return f"{scheme}://{host}:{self.http_port}"

    def kafka_extra(self) -> dict[str, str]:
        """The pass-through librdkafka settings as a dict."""
        out: dict[str, str] = {}
        for item in filter(None, (s.strip() for s in self.kafka_options.split(","))):
            key, sep, value = item.partition("=")
            if not sep:
                raise ValueError(f"kafka option {item!r} is not key=value")
            out[key.strip()] = value.strip()
        return out

    # Loading ---------------------------------------------------------------------------------

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser, skip: Sequence[str] = ()) -> None:
        """Add one `--flag` per field; defaults are resolved later so env vars can apply."""
        for f in fields(cls):
            if f.name in skip:
                continue
            flag = "--" + f.name.replace("_", "-")
            kw: dict[str, Any] = {
                "dest": f.name,
                "default": None,
                "help": f"{f.metadata['help']} [env VQ_{f.name.upper()}; default {f.default!r}]",
            }
            if "choices" in f.metadata:
                kw["choices"] = f.metadata["choices"]
            if f.type in ("bool", bool):
                kw["action"] = argparse.BooleanOptionalAction
            else:
                kw["type"] = int if f.type in ("int", int) else str
            parser.add_argument(flag, **kw)

    @classmethod
    def load(cls, args: argparse.Namespace | Mapping[str, Any] | None = None,
             env: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        """Build settings: explicit overrides > CLI args > `VQ_*` env > defaults."""
        env = os.environ if env is None else env
        given = vars(args) if isinstance(args, argparse.Namespace) else dict(args or {})
        values: dict[str, Any] = {}
        for f in fields(cls):
            raw: Any = overrides.get(f.name, given.get(f.name))
            if raw is None:
                raw = env.get(f"VQ_{f.name.upper()}")
            if raw is None:
                continue
            is_int = f.type in ("int", int)
            try:
                if f.type in ("bool", bool):
                    values[f.name] = _to_bool(raw)
                else:
                    values[f.name] = int(raw) if is_int else str(raw)
            except ValueError:
                raise ValueError(f"VQ_{f.name.upper()}/--{f.name.replace('_', '-')}: "
                                 f"{raw!r} is not a valid {f.type}") from None
            choices = f.metadata.get("choices")
            if choices and values[f.name] not in choices:
                raise ValueError(f"{f.name} must be one of {choices}, not {raw!r}")
        settings = cls(**values)
        settings.validate()
        return settings

    def validate(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, int) and not isinstance(value, bool) and value < 0:
                raise ValueError(f"{f.name} must not be negative")
        for name in ("max_batch_records", "max_read_limit", "default_read_limit", "fetchers",
                     "max_body_bytes", "body_timeout_ms", "max_record_bytes", "max_read_bytes",
                     "max_list_queues",
                     "gc_young_threshold", "retention_check_s", "snapshot_interval_s",
                     "default_max_attempts", "max_lease_records", "max_lease_window",
                     "scheduler_tick_ms"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")
        if self.compacted_segment_bytes < 1024 * 1024:
            raise ValueError("compacted_segment_bytes must be at least 1048576 (1 MiB, Kafka's "
                             "minimum segment.bytes)")
        if self.compacted_segment_ms < 1:
            raise ValueError("compacted_segment_ms must be at least 1")
        if self.default_read_limit > self.max_read_limit:
            raise ValueError("default_read_limit must not exceed max_read_limit")
        if not MIN_VISIBILITY_MS <= self.default_visibility_ms <= self.max_visibility_ms:
            raise ValueError(f"default_visibility_ms must be between {MIN_VISIBILITY_MS} and "
                             "max_visibility_ms")
        if self.self_fence_ms and \
                self.self_fence_ms + self.heartbeat_interval_ms >= self.session_timeout_ms:
            raise ValueError("self_fence_ms must be below session_timeout_ms minus "
                             "heartbeat_interval_ms (a longer pause could lose the session "
                             "unseen), or 0")
        for name in ("producer_busy_linger_ms", "tail_pace_ms"):
            value = getattr(self, name)
            if value != "auto" and not (value.isascii() and value.isdigit()):
                raise ValueError(f"{name} must be auto or a whole number of ms")
        if not (len(self.sqs_account_id) == 12 and self.sqs_account_id.isascii()
                and self.sqs_account_id.isdigit()):
            raise ValueError("sqs_account_id must be 12 digits")
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ValueError("tls_cert and tls_key go together: give both or neither")
        self.kafka_extra()

    def busy_linger_ms(self, embedded: bool) -> int:
        """`producer_busy_linger_ms` for this broker (`embedded`: tansu)."""
        return _auto_ms(self.producer_busy_linger_ms, embedded, BUSY_LINGER_EMBEDDED_MS,
                        BUSY_LINGER_KAFKA_MS)

    def tail_pace(self, embedded: bool) -> int:
        """`tail_pace_ms` for this broker (`embedded`: tansu)."""
        return _auto_ms(self.tail_pace_ms, embedded, TAIL_PACE_EMBEDDED_MS, TAIL_PACE_KAFKA_MS)

    def ssl_context(self) -> ssl.SSLContext | None:
        """The HTTPS server's context (TLS 1.2 or newer), or None when TLS is off."""
        if not self.tls_cert:
            return None
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.load_cert_chain(self.tls_cert, self.tls_key)
        return ctx

    def client_ssl_context(self) -> ssl.SSLContext:
        """What a node trusts when it calls another node (the forwarding proxy)."""
        return ssl.create_default_context(cafile=self.tls_ca_file or None)


def _to_bool(raw: Any) -> bool:
    if isinstance(raw, bool):
        return raw
    text = str(raw).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(raw)
