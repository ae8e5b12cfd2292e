"""Query parameters: each declared once, with its range and default taken from Settings. Request
validation and the OpenAPI document both read these, so they cannot drift apart."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from vqueues.errors import BadRequest
from vqueues.settings import MIN_VISIBILITY_MS, Settings

MAX_OFFSET = 2**63 - 1
DEFAULT_LIST_LIMIT = 1000


@dataclass(frozen=True, slots=True)
class IntParam:
    """An integer query parameter in [minimum, maximum(settings)], default(settings) if absent."""

    name: str
    minimum: int
    maximum: Callable[[Settings], int]
    default: Callable[[Settings], int | None]
    description: str

    def parse(self, query: Mapping[str, str], settings: Settings) -> int | None:
        raw = query.get(self.name)
        if raw is None:
            return self.default(settings)
        try:
            value = int(raw)
        except ValueError:
            raise BadRequest("invalid_parameter",
                             f"{self.name} must be an integer, not {raw!r}") from None
        return self._in_range(value, settings)

    def from_body(self, body: Mapping[str, Any], settings: Settings) -> int | None:
        """The parameter from a JSON body (an integer, not a string)."""
        raw = body.get(self.name)
        if raw is None:
            return self.default(settings)
        if isinstance(raw, bool) or not isinstance(raw, int):
            raise BadRequest("invalid_parameter", f"{self.name} must be an integer",
                             parameter=self.name)
        return self._in_range(raw, settings)

    def _in_range(self, value: int, settings: Settings) -> int:
        hi = self.maximum(settings)
        if not self.minimum <= value <= hi:
            raise BadRequest("limit_out_of_range", f"{self.name} must be between "
                             f"{self.minimum} and {hi}", parameter=self.name,
                             min=self.minimum, max=hi)
        return value

    def body_schema(self, settings: Settings, nullable: bool = True) -> dict[str, Any]:
        """The parameter as a body field: null is taken as left out (`from_body`), unless the
        route requires the field."""
        schema = self.openapi(settings)["schema"]
        kind = ["integer", "null"] if nullable else "integer"
        return {**schema, "type": kind, "description": self.description}

    def require(self, query: Mapping[str, str], settings: Settings) -> int:
        """`parse` for a parameter that has a default."""
        value = self.parse(query, settings)
        assert value is not None, f"{self.name} has no default"
        return value

    def openapi(self, settings: Settings) -> dict[str, Any]:
        schema: dict[str, Any] = {"type": "integer", "minimum": self.minimum,
                                  "maximum": self.maximum(settings)}
        default = self.default(settings)
        if default is not None:
            schema["default"] = default
        return {"name": self.name, "in": "query", "description": self.description,
                "schema": schema}


READ_OFFSET = IntParam("offset", 0, lambda s: MAX_OFFSET, lambda s: None,
                       "start here (default: the consumer's committed offset, else the first "
                       "retained record)")
READ_LIMIT = IntParam("limit", 1, lambda s: s.max_read_limit, lambda s: s.default_read_limit,
                      "most records to return")
READ_WAIT_MS = IntParam("wait_ms", 0, lambda s: s.max_wait_ms, lambda s: 0,
                        "long poll: wait up to this long for a first record")
LIST_LIMIT = IntParam("limit", 1, lambda s: s.max_list_queues,
                      lambda s: min(DEFAULT_LIST_LIMIT, s.max_list_queues),
                      "most queue names to return")
LEASE_MAX_RECORDS = IntParam("max_records", 1, lambda s: s.max_lease_records, lambda s: 1,
                             "most records to lease")
LEASE_WAIT_MS = IntParam("wait_ms", 0, lambda s: s.max_wait_ms, lambda s: 0,
                         "long poll: wait up to this long for a first record")
LEASE_VISIBILITY_MS = IntParam("visibility_ms", MIN_VISIBILITY_MS, lambda s: s.max_visibility_ms,
                               lambda s: None, "lease length (default: the consumer's "
                               "visibility_ms setting)")
RETRY_DELAY_MS = IntParam("delay_ms", 0, lambda s: s.max_retry_delay_ms, lambda s: 0,
                          "the records are available again after this long")
