"""The unit tier: pure state, codecs and lifecycles through in-memory fakes; no broker.

Every test under tests/unit/ is marked `unit` (by tests/conftest.py), so `scripts/test -m unit`
runs this tier alone.
"""
