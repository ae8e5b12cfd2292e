"""Snapshots of a partition's state: the wire format, capture and restore (ADR 7)."""
