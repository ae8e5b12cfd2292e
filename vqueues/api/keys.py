"""Typed keys of what the aiohttp application holds."""

from __future__ import annotations

import aiohttp
from aiohttp import web

from vqueues.service import QueueService
from vqueues.settings import Settings

SERVICE = web.AppKey("service", QueueService)
SETTINGS = web.AppKey("settings", Settings)
PROXY = web.AppKey("proxy", aiohttp.ClientSession)
