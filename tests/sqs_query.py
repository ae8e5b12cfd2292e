"""An SQS client of boto3 that speaks the query protocol (form bodies, XML answers), as SDKs
did before AWS JSON 1.0: botocore loads SQS's last query-protocol model (botocore 1.34.22's,
without its documentation) from tests/data/botocore_sqs_query before its own."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import boto3
import botocore.session
from botocore.config import Config

MODELS = Path(__file__).parent / "data" / "botocore_sqs_query"


def query_client(url: str, key: str = "x", secret: str = "x", attempts: int = 2,
                 region: str = "us-east-1") -> Any:
    core = botocore.session.get_session()
    core.get_component("data_loader").search_paths.insert(0, str(MODELS))
    client = boto3.session.Session(botocore_session=core).client(
        "sqs", endpoint_url=url, region_name=region, aws_access_key_id=key,
        aws_secret_access_key=secret, config=Config(
            retries={"max_attempts": attempts, "mode": "standard"}, read_timeout=60))
    assert client.meta.service_model.protocol == "query"
    return client
