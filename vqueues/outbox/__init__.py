"""The transactional outbox for PostgreSQL: its schema, and the relay that moves committed rows
to their queues (docs/outbox.md, ADR 18)."""
