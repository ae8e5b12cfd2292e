"""Typed keys of what the aiohttp application holds."""

from __future__ import annotations

import aiohttp
from aiohttp import web

from vqueues.api.auth import Authenticator, Identity
from vqueues.api.sqs.attempts import ReceiveAttempts
from vqueues.api.sqs.signatures import AccessKeyFile
from vqueues.queues.quotas import QuotaFile
from vqueues.queues.service import QueueService
from vqueues.settings import Settings
from vqueues.work.prefix_leasing import PrefixLeasing
from vqueues.work.work_service import WorkService

SERVICE = web.AppKey("service", QueueService)
SETTINGS = web.AppKey("settings", Settings)
WORK = web.AppKey("work", WorkService)
PREFIX = web.AppKey("prefix", PrefixLeasing)
# The caller, with auth on (set by the auth middleware; a handler checks a body's queue names).
IDENTITY = web.RequestKey("identity", Identity)
PROXY = web.AppKey("proxy", aiohttp.ClientSession)
AUTH = web.AppKey("auth", Authenticator)
QUOTAS = web.AppKey("quotas", QuotaFile)
# The SQS API's access keys, with auth on and sqs_access_key_file set (api/sqs/signatures.py).
SQS_KEYS = web.AppKey("sqs_keys", AccessKeyFile)
# The SQS API's receive answers by ReceiveRequestAttemptId (api/sqs/attempts.py).
SQS_ATTEMPTS = web.AppKey("sqs_attempts", ReceiveAttempts)
# The query parameters of each documented route, by (path template, METHOD) (api/openapi.py).
QUERY_PARAMETERS = web.AppKey("query_parameters", dict[tuple[str, str], frozenset[str]])
