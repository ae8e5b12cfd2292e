"""The web console at /ui (vqueues/console/: plain HTML, CSS and JavaScript shipped in the
package, no build step, no CDN), and the CORS rule that lets a console served by one node call
the others: only origins that are nodes of this cluster are allowed."""

from __future__ import annotations

from importlib import resources

from aiohttp import web

from vqueues.api.keys import SERVICE, SETTINGS
from vqueues.api.middlewares import Handler

_TYPES = {".html": "text/html", ".js": "text/javascript", ".css": "text/css"}
_FILES = {f.name: (f.read_bytes(), _TYPES[f.name[f.name.rfind("."):]])
          for f in resources.files("vqueues.console").iterdir()
          if f.name[f.name.rfind("."):] in _TYPES}
# The console loads only its own files; it may call any node of the cluster (connect-src).
_CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self' http: https:; form-action 'none'; frame-ancestors 'none'; "
        "base-uri 'none'")


async def index(request: web.Request) -> web.StreamResponse:
    if request.path == "/ui":
        raise web.HTTPFound("/ui/")
    return _file("index.html")


async def asset(request: web.Request) -> web.StreamResponse:
    return _file(request.match_info["name"])


def _file(name: str) -> web.Response:
    if name not in _FILES:
        raise web.HTTPNotFound()
    body, content_type = _FILES[name]
    return web.Response(body=body, content_type=content_type, charset="utf-8",
                        headers={"Cache-Control": "no-cache", "Content-Security-Policy": _CSP,
                                 "X-Content-Type-Options": "nosniff"})


def routes() -> list[web.RouteDef]:
    return [web.get("/ui", index), web.get("/ui/", index), web.get("/ui/{name}", asset)]


def _cluster_origins(request: web.Request) -> set[str]:
    owners = request.app[SERVICE].ownership.cluster_map.owners.values()
    return {request.app[SETTINGS].effective_url, *(o.url.rstrip("/") for o in owners)}


_ALLOW = {"Access-Control-Allow-Methods": "GET, POST, PUT, DELETE",
          "Access-Control-Allow-Headers": "Authorization, Content-Type",
          "Access-Control-Max-Age": "600", "Vary": "Origin"}


@web.middleware
async def cors_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Cross-origin calls from a console on another node of this cluster: preflights are
    answered here (before auth: they carry no token), answers carry Allow-Origin. Any other
    origin gets no CORS headers, so browsers keep its pages out."""
    origin = request.headers.get("Origin")
    allowed = origin is not None and origin.rstrip("/") in _cluster_origins(request)
    if request.method == "OPTIONS" and allowed and \
            "Access-Control-Request-Method" in request.headers:
        return web.Response(status=204, headers={"Access-Control-Allow-Origin": str(origin),
                                                 **_ALLOW})
    response = await handler(request)
    if allowed and not response.prepared:
        response.headers["Access-Control-Allow-Origin"] = str(origin)
        response.headers["Vary"] = "Origin"
    return response
