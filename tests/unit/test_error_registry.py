"""One error registry: declared once, documented exactly, and every raised code is in it."""

import re
from pathlib import Path

import pytest

from vqueues.api.openapi import openapi_document
from vqueues.errors import REGISTRY, BadRequest, VQError
from vqueues.settings import Settings

ROOT = Path(__file__).resolve().parents[2]


def _documented_codes() -> set[str]:
    text = (ROOT / "docs/api.md").read_text()
    table = text.split("## Errors", 1)[1].split("\n## ", 1)[0]
    codes = set()
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 4 and cells[0].isdigit():
            codes.update(re.findall(r"`([a-z_]+)`", cells[1]))
    return codes


def test_docs_api_lists_exactly_the_registrys_codes():
    assert _documented_codes() == set(REGISTRY)


def test_docs_give_each_code_its_registry_status_and_retriable_flag():
    text = (ROOT / "docs/api.md").read_text().split("## Errors", 1)[1].split("\n## ", 1)[0]
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 4 and cells[0].isdigit():
            for code in re.findall(r"`([a-z_]+)`", cells[1]):
                spec = REGISTRY[code]
                assert int(cells[0]) == spec.status, code
                assert cells[2] == ("yes" if spec.retriable else "no"), code


def test_every_code_the_source_raises_is_in_the_registry():
    pattern = re.compile(r"\b(?:VQError|BadRequest|NotFound|Conflict|WrongNode|PayloadTooLarge|"
                         r"Unavailable|BrokerError|UnreadableBody)\(\s*\"([a-z_]+)\"")
    raised = set()
    for path in (ROOT / "vqueues").rglob("*.py"):
        raised.update(pattern.findall(path.read_text()))
    assert raised and raised <= set(REGISTRY), raised - set(REGISTRY)


def test_an_unregistered_code_cannot_be_raised():
    with pytest.raises(KeyError):
        BadRequest("no_such_code")


def test_every_error_body_carries_code_message_and_retriable():
    body = VQError("wrong_node", "elsewhere", owner="http://x").to_json()
    assert body == {"error": {"code": "wrong_node", "message": "elsewhere", "retriable": True,
                              "owner": "http://x"}}
    assert BadRequest("invalid_name").to_json()["error"]["retriable"] is False


def test_the_openapi_error_schema_enumerates_the_registry():
    doc = openapi_document(Settings())
    enum = doc["components"]["schemas"]["Error"]["properties"]["error"]["properties"]["code"]
    assert enum["enum"] == sorted(REGISTRY)
