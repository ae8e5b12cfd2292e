"""A node's HTTP app with auth on and SQS access keys, for the SQS route's unit tests."""

import json
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from aiohttp.test_utils import TestClient, TestServer

from tests.unit.nodes import queue_service
from vqueues.api.app import create_app
from vqueues.settings import Settings


async def signed_app(folder: Path, keys: list[dict[str, Any]] | None
                     ) -> AsyncIterator[TestClient[Any, Any]]:
    """Yields a client of the app, `keys` its access key file (mode 600; None: it has none)
    and no tokens."""
    tokens = folder / "tokens.json"
    tokens.write_text(json.dumps({"tokens": []}))
    key_file = None
    if keys is not None:
        key_file = folder / "keys.json"
        key_file.write_text(json.dumps({"keys": keys}))
        os.chmod(key_file, 0o600)
    settings = Settings(write_visible_timeout_ms=1000, auth=True, auth_token_file=str(tokens),
                        sqs_access_key_file=str(key_file) if key_file else "")
    svc = await queue_service(settings)
    server = TestServer(create_app(svc, settings))
    await server.start_server(auto_decompress=False, access_log=None)
    async with TestClient(server) as client:
        yield client
    svc.close()
