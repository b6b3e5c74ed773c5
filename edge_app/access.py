"""Who may use the server: bearer token, per-client offer rate, TLS.

* Token: when ``[server] token`` or the ``EDGE_APP_TOKEN`` environment variable (which wins) is set,
  every request but the page (``/``, ``/static/``) and ``/healthz`` needs ``Authorization: Bearer
  TOKEN``; the comparison is constant-time (``hmac.compare_digest``).  The page reads the token from
  its URL fragment (``/#token=...``, never sent to the server in the request line) or asks for it.
* Offers per client: at most ``max_offers_per_minute`` offers per client address in any 60 s; more get
  429 with ``Retry-After``.
* CORS: pages served from another origin may call the API only when ``[server] cors_origins`` names that origin
  (or is ``["*"]``); their preflight ``OPTIONS`` is answered here, before the token check (browsers send no
  ``Authorization`` on a preflight).  Empty (the default): same origin only, no CORS headers at all.
* TLS: ``tls_cert`` + ``tls_key`` make ``edge-app serve`` speak HTTPS (browsers allow camera access only
  on secure origins, so a box serving other machines needs it).
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
import os
import ssl
import time
from collections import OrderedDict, deque

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from edge_app.config import AppConfig, ConfigError

log = logging.getLogger(__name__)

TOKEN_ENV = "EDGE_APP_TOKEN"
PUBLIC_PATHS = ("/", "/healthz", "/favicon.ico")
PUBLIC_PREFIXES = ("/static/",)
MIN_TOKEN_CHARS = 16


def effective_token(cfg: AppConfig, environ: dict[str, str] | None = None) -> str | None:
    env = os.environ if environ is None else environ
    token = env.get(TOKEN_ENV)
    if token is not None:
        token = token.strip()
        if len(token) < MIN_TOKEN_CHARS:
            raise ConfigError(f"{TOKEN_ENV}: the token must be at least {MIN_TOKEN_CHARS} characters "
                              f"(make one with: python3 -c 'import secrets; print(secrets.token_urlsafe(32))')")
        return token
    return cfg.server.token


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def auth_middleware(token: str) -> Middleware:
    expected = token.encode()

    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        path = request.path
        if path in PUBLIC_PATHS or path.startswith(PUBLIC_PREFIXES):
            return await handler(request)
        header = request.headers.get("Authorization", "")
        scheme, _, given = header.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), expected):
            reason = ("missing Authorization: Bearer TOKEN header" if not header
                      else "wrong token" if scheme.lower() == "bearer" else "use the Bearer scheme")
            return web.json_response({"error": f"unauthorized: {reason}"}, status=401,
                                     headers={"WWW-Authenticate": 'Bearer realm="edge-app"'})
        return await handler(request)

    return check


CORS_METHODS = "GET, POST, PUT, PATCH, DELETE, OPTIONS"  # WHIP/WHEP players end their session with DELETE
CORS_HEADERS = "Authorization, Content-Type"
CORS_EXPOSED = "Location, ETag"  # a WHIP/WHEP player from another origin reads its session's URL


def cors_middleware(origins: list[str]) -> Middleware:
    """Answer CORS preflights and add ``Access-Control-Allow-Origin`` for the configured origins."""
    allowed = set(origins)

    def allows(origin: str) -> bool:
        return "*" in allowed or origin in allowed

    @web.middleware
    async def cors(request: web.Request, handler: Handler) -> web.StreamResponse:
        origin = request.headers.get("Origin")
        if origin is None:
            return await handler(request)
        if request.method == "OPTIONS" and "Access-Control-Request-Method" in request.headers:
            if not allows(origin):
                return web.json_response({"error": f"origin {origin!r} is not in [server] cors_origins"},
                                         status=403)
            return web.Response(status=204, headers={
                "Access-Control-Allow-Origin": origin, "Access-Control-Allow-Methods": CORS_METHODS,
                "Access-Control-Allow-Headers": CORS_HEADERS, "Access-Control-Max-Age": "600", "Vary": "Origin"})
        response = await handler(request)  # json_errors, inside this one, has made aiohttp's 4xx responses
        if allows(origin):
            response.headers["Access-Control-Allow-Origin"] = origin
            response.headers["Access-Control-Expose-Headers"] = CORS_EXPOSED
            response.headers["Vary"] = "Origin"
        return response

    return cors


class OfferRateLimiter:
    """At most ``per_minute`` events per key in any 60 s window; remembers at most ``max_keys`` keys."""

    def __init__(self, per_minute: int, max_keys: int = 10_000, window_s: float = 60.0) -> None:
        self.per_minute = per_minute
        self.window_s = window_s
        self.max_keys = max_keys
        self._seen: OrderedDict[str, deque[float]] = OrderedDict()

    def check(self, key: str, now: float | None = None) -> float | None:
        """Record an event for ``key``; None if allowed, else the seconds until the next one would be."""
        t = time.monotonic() if now is None else now
        q = self._seen.pop(key, None) or deque()
        while q and t - q[0] >= self.window_s:
            q.popleft()
        allowed = len(q) < self.per_minute
        if allowed:
            q.append(t)
        self._seen[key] = q  # most recent last
        while len(self._seen) > self.max_keys:
            self._seen.popitem(last=False)
        return None if allowed else max(0.0, self.window_s - (t - q[0]))


def tls_context(cfg: AppConfig) -> ssl.SSLContext | None:
    s = cfg.server
    if s.tls_cert is None or s.tls_key is None:
        return None
    cert, key = cfg.resolve(s.tls_cert), cfg.resolve(s.tls_key)
    for name, p in (("tls_cert", cert), ("tls_key", key)):
        if not p.is_file():
            raise ConfigError(f"[server] {name}: {p}: no such file (see the README's 'Operating it' for making a "
                              f"self-signed certificate)")
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        ctx.load_cert_chain(cert, key)
    except (ssl.SSLError, ValueError) as exc:
        raise ConfigError(f"[server] tls_cert/tls_key: {cert} and {key} are not a PEM certificate and its "
                          f"key ({exc})") from exc
    return ctx
