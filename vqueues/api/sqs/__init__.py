"""The SQS-compatible API (docs/sqs.md, ADR 17): AWS JSON 1.0 calls posted to `/` (or to a
queue URL's path), decoded here and answered through the work and queue services."""
