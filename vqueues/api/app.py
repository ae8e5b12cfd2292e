"""The aiohttp application of one node: middlewares, routes, and the proxy's client session."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from aiohttp import web

from vqueues.api import compat, console, handlers, multi, prefix, stream, work
from vqueues.api.auth import Authenticator
from vqueues.api.keys import (
    AUTH,
    PREFIX,
    QUERY_PARAMETERS,
    QUOTAS,
    SERVICE,
    SETTINGS,
    SQS_ATTEMPTS,
    SQS_KEYS,
    WORK,
)
from vqueues.api.middlewares import (
    auth_middleware,
    error_middleware,
    fence_middleware,
    metrics_middleware,
    text_middleware,
)
from vqueues.api.openapi import openapi_document, query_parameters
from vqueues.api.proxy import forward_middleware, proxy_session
from vqueues.api.sqs import route as sqs
from vqueues.api.sqs.attempts import ReceiveAttempts
from vqueues.api.sqs.signatures import AccessKeyFile
from vqueues.queues.quotas import QuotaFile, Quotas
from vqueues.queues.service import QueueService
from vqueues.settings import Settings
from vqueues.work.prefix_leasing import PrefixLeasing
from vqueues.work.work_service import WorkService


def authenticator(settings: Settings) -> Authenticator | None:
    """The node's Authenticator, or None when auth is off."""
    if not settings.auth:
        return None
    return Authenticator(settings.auth_token_file, settings.auth_jwt_secret,
                         settings.auth_jwt_public_key, settings.auth_jwt_audience,
                         settings.auth_jwt_allow_no_exp, bool(settings.sqs_access_key_file))


async def _reload_files(app: web.Application) -> AsyncIterator[None]:
    """Reread the token, access key and quota files when they change (checked every second),
    without a restart."""
    tokens = app[AUTH].tokens if AUTH in app else None
    files = [f for f in (tokens, app.get(SQS_KEYS), app.get(QUOTAS)) if f is not None]

    async def watch() -> None:
        while True:
            await asyncio.sleep(1.0)
            for f in files:
                f.reload()

    task = asyncio.create_task(watch()) if files else None
    yield
    if task is not None:
        task.cancel()


def create_app(service: QueueService, settings: Settings) -> web.Application:
    """The application serving `service`; limits come from `settings` (docs/api.md)."""
    # cors sits outside error, so that error answers carry its headers too.
    middlewares = [metrics_middleware, console.cors_middleware, error_middleware, text_middleware]
    if settings.forward:
        middlewares.append(forward_middleware)  # the owner authorises a forwarded request
    auth = authenticator(settings)
    if auth is not None:
        middlewares.append(auth_middleware)
    middlewares.append(fence_middleware)  # after auth: a refused caller learns nothing of it
    app = web.Application(middlewares=middlewares, client_max_size=settings.max_body_bytes)
    app[SERVICE] = service
    app[SETTINGS] = settings
    app[QUERY_PARAMETERS] = query_parameters(openapi_document(settings))
    app[WORK] = WorkService(settings, service, service.entries, service.reader)
    app[PREFIX] = PrefixLeasing(app[WORK])
    app[SQS_ATTEMPTS] = ReceiveAttempts()
    if auth is not None:
        app[AUTH] = auth
        if settings.sqs_access_key_file:
            app[SQS_KEYS] = AccessKeyFile(settings.sqs_access_key_file)
    if settings.quota_file:
        app[QUOTAS] = QuotaFile(settings.quota_file, Quotas([]))
    app.cleanup_ctx.append(_reload_files)
    # --forward's proxy and the SQS API's forwarding (docs/sqs.md) share one client session.
    app.cleanup_ctx.append(proxy_session)
    q = "/v1/queues/{queue:[^/]+}"
    c = q + "/consumers/{consumer:[^/]+}"
    app.router.add_post(f"{q}/records", handlers.enqueue)
    app.router.add_get(f"{q}/records", handlers.read)
    app.router.add_post("/v1/records", multi.enqueue_many)
    app.router.add_post(f"{c}/ack", handlers.ack)
    app.router.add_delete(c, handlers.delete_consumer)
    app.router.add_put(c, work.put_consumer)
    app.router.add_get(c, work.get_consumer)
    app.router.add_post(f"{c}/lease", work.lease)
    app.router.add_post(f"{c}/complete", work.complete)
    app.router.add_post(f"{c}/retry", work.retry)
    app.router.add_post(f"{c}/extend", work.extend)
    app.router.add_get(f"{c}/stream", stream.stream)
    app.router.add_delete(q + "/scheduled/{id}", handlers.cancel_scheduled)
    app.router.add_get(q, handlers.queue_info)
    app.router.add_delete(q, handlers.delete_queue)
    app.router.add_get("/v1/queues", handlers.list_queues)
    pc = "/v1/prefix-consumers/{consumer:[^/]+}"
    app.router.add_get("/v1/prefix-consumers", prefix.list_prefix_consumers)
    app.router.add_put(pc, prefix.put_prefix_consumer)
    app.router.add_get(pc, prefix.get_prefix_consumer)
    app.router.add_delete(pc, prefix.delete_prefix_consumer)
    app.router.add_post(f"{pc}/lease", prefix.lease)
    app.router.add_post(f"{pc}/complete", prefix.complete)
    app.router.add_post(f"{pc}/retry", prefix.retry)
    app.router.add_post(f"{pc}/extend", prefix.extend)
    app.router.add_get("/v1/partitions", handlers.partitions)
    app.router.add_get("/v1/openapi.json", handlers.openapi)
    app.router.add_routes(compat.routes())
    app.router.add_routes(console.routes())
    app.router.add_routes(sqs.routes())  # the SQS-compatible API (docs/sqs.md)
    app.router.add_get("/metrics", handlers.metrics)
    app.router.add_get("/healthz", handlers.healthz)
    app.router.add_get("/readyz", handlers.readyz)
    return app
