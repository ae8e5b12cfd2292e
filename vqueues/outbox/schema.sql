-- The transactional outbox of vqueues (docs/outbox.md, docs/adr/0018-transactional-outbox.md).
-- Applied by `vqueues outbox install --dsn ...`; running it again changes nothing that exists
-- (it only creates what is missing and replaces the functions).

CREATE SCHEMA IF NOT EXISTS vqueues_outbox;

-- One row: this database's namespace, which names every row the relay sends
-- (the record header `vq-outbox-id: <namespace>:<id>`), so two databases never collide.
CREATE TABLE IF NOT EXISTS vqueues_outbox.meta (
    one boolean PRIMARY KEY DEFAULT true CHECK (one),
    namespace text NOT NULL,
    schema_version integer NOT NULL
);
INSERT INTO vqueues_outbox.meta (namespace, schema_version)
VALUES (gen_random_uuid()::text, 1)
ON CONFLICT DO NOTHING;

CREATE SEQUENCE IF NOT EXISTS vqueues_outbox.record_ids;

-- A queue's 32-bit key (md5, stable across PostgreSQL versions): the transaction lock at insert.
CREATE OR REPLACE FUNCTION vqueues_outbox.queue_key(queue text) RETURNS integer
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
AS $$ SELECT ('x' || substr(md5(queue), 1, 8))::bit(32)::integer $$;

-- A queue's bucket (0-63): a relay holds a bucket's session lock to relay its queues.
CREATE OR REPLACE FUNCTION vqueues_outbox.bucket_of(queue text) RETURNS smallint
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
AS $$ SELECT (('x' || substr(md5(queue), 1, 4))::bit(16)::integer % 64)::smallint $$;

-- The rules of a tag list that SQL can state (the helper checks the node's exact rule).
CREATE OR REPLACE FUNCTION vqueues_outbox.tags_ok(tags text[]) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT tags IS NULL OR (
        cardinality(tags) <= 8
        AND array_position(tags, NULL) IS NULL
        AND NOT EXISTS (
            SELECT 1 FROM unnest(tags) t
            WHERE octet_length(t) NOT BETWEEN 1 AND 64 OR strpos(t, ',') > 0 OR t <> btrim(t)))
$$;

-- Headers: a JSON object of strings, without the relay's own header.
CREATE OR REPLACE FUNCTION vqueues_outbox.headers_ok(headers jsonb) RETURNS boolean
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
AS $$
    SELECT jsonb_typeof(headers) = 'object'
        AND NOT headers ? 'vq-outbox-id'
        AND NOT jsonb_path_exists(headers, '$.* ? (@.type() != "string")')
$$;

CREATE TABLE IF NOT EXISTS vqueues_outbox.records (
    id bigint PRIMARY KEY,            -- set by the trigger below: commit order per queue
    queue text NOT NULL,
    value bytea,
    headers jsonb NOT NULL DEFAULT '{}',
    ordering_key text,                -- sent as the header vq-ordering-key
    tags text[],
    idempotency_key text,             -- yours; without it the relay keys the row itself
    deliver_at bigint,                -- UTC epoch ms; NULL: at once
    created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    bucket smallint GENERATED ALWAYS AS (vqueues_outbox.bucket_of(queue)) STORED,
    CONSTRAINT queue_name CHECK (octet_length(queue) BETWEEN 1 AND 249
                                 AND queue !~ '[\u0001-\u001f\u007f-\u009f]'),
    CONSTRAINT headers_valid CHECK (vqueues_outbox.headers_ok(headers)),
    CONSTRAINT tags_valid CHECK (vqueues_outbox.tags_ok(tags)),
    CONSTRAINT idempotency_key_size CHECK (idempotency_key IS NULL
                                           OR octet_length(idempotency_key) BETWEEN 1 AND 256),
    CONSTRAINT ordering_key_size CHECK (ordering_key IS NULL OR ordering_key <> '')
);
-- Relayed rows are deleted in batches: vacuum the table after every 1% of it changed, not 20%.
ALTER TABLE vqueues_outbox.records SET (autovacuum_vacuum_scale_factor = 0.01,
                                        autovacuum_vacuum_insert_scale_factor = 0.01);

-- Commit order per queue: a row takes its queue's transaction lock BEFORE its id, so two
-- transactions writing to one queue are serialized until the first ends, and a queue's ids
-- are in commit order. A relay that sees id N of a queue knows every lower id of that queue
-- is committed or rolled back.
CREATE OR REPLACE FUNCTION vqueues_outbox.before_insert() RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(30321, vqueues_outbox.queue_key(NEW.queue));
    NEW.id := nextval('vqueues_outbox.record_ids');
    NEW.created_at := clock_timestamp();  -- the insert, not its transaction's start
    RETURN NEW;
END
$$;
CREATE OR REPLACE TRIGGER commit_order BEFORE INSERT ON vqueues_outbox.records
FOR EACH ROW EXECUTE FUNCTION vqueues_outbox.before_insert();

-- Wakes relays (LISTEN vqueues_outbox) when the inserting transaction commits.
CREATE OR REPLACE FUNCTION vqueues_outbox.after_insert() RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    PERFORM pg_notify('vqueues_outbox', '');
    RETURN NULL;
END
$$;
CREATE OR REPLACE TRIGGER wake_relays AFTER INSERT ON vqueues_outbox.records
FOR EACH STATEMENT EXECUTE FUNCTION vqueues_outbox.after_insert();

-- Per queue: the queue's offset after the relay's last confirmed record, and when a send not
-- yet confirmed started (NULL: none). A relay that finds `sent_at` set reads the queue from
-- `next_offset` before it sends that queue's rows again.
CREATE TABLE IF NOT EXISTS vqueues_outbox.queues (
    queue text PRIMARY KEY,
    next_offset bigint,
    sent_at timestamptz
);

-- Rows the node refused for good (a 4xx that is not retriable), with its error.
CREATE TABLE IF NOT EXISTS vqueues_outbox.dead (
    id bigint PRIMARY KEY,
    queue text NOT NULL,
    value bytea,
    headers jsonb NOT NULL,
    ordering_key text,
    tags text[],
    idempotency_key text,
    deliver_at bigint,
    created_at timestamptz NOT NULL,
    failed_at timestamptz NOT NULL DEFAULT now(),
    error jsonb NOT NULL
);
