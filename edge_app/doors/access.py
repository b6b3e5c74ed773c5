"""Who may use the server: bearer token, per-client offer rate, TLS.

* Tokens: when ``[server] token`` or the ``EDGE_APP_TOKEN`` environment variable (which wins) is set,
  every request but the page (``/``, ``/static/``) and ``/healthz`` needs ``Authorization: Bearer
  TOKEN``; the comparison is constant-time (``hmac.compare_digest``).  The page reads the token from
  its URL fragment (``/#token=...``, never sent to the server in the request line) or asks for it.
* Roles: that token is the operator's (everything). ``[server] viewer_token`` (or ``EDGE_APP_VIEWER_TOKEN``) is a
  viewer's: watch (offers, WHIP/WHEP, ending a session), results, events, status and metrics (``GET``); anything
  else (teaching, deploying, rolling back, deleting events, moving a region, reading the scenes' frames) answers
  403 with the reason. ``request["role"]`` says which; ``GET /api/role`` tells the page.
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
from dataclasses import dataclass

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from edge_app.config import AppConfig, ConfigError

log = logging.getLogger(__name__)

TOKEN_ENV = "EDGE_APP_TOKEN"
VIEWER_TOKEN_ENV = "EDGE_APP_VIEWER_TOKEN"
ROLE_KEY = web.RequestKey("role", str)
# what a viewer may do beyond GET: watch (and end what it watches)
VIEWER_WRITES = (("POST", "/offer"), ("POST", "/whip"), ("POST", "/whep/"), ("DELETE", "/sessions/"),
                 ("PATCH", "/sessions/"))
# what a viewer may not even read: the teaching work (the scene's frames, recordings, training, shadow runs)
OPERATOR_READS = ("/api/datasets", "/api/recordings", "/api/training", "/api/shadow")
PUBLIC_PATHS = ("/", "/healthz", "/favicon.ico")
PUBLIC_PREFIXES = ("/static/",)
MIN_TOKEN_CHARS = 16


@dataclass(frozen=True)
class Tokens:
    operator: str | None = None
    viewer: str | None = None


def _from_env(env: dict[str, str] | os._Environ[str], name: str, configured: str | None) -> str | None:
    token = env.get(name)
    if token is None:
        return configured
    token = token.strip()
    if len(token) < MIN_TOKEN_CHARS:
        raise ConfigError(f"{name}: the token must be at least {MIN_TOKEN_CHARS} characters "
                          f"(make one with: python3 -c 'import secrets; print(secrets.token_urlsafe(32))')")
    return token


def effective_tokens(cfg: AppConfig, environ: dict[str, str] | None = None) -> Tokens:
    env = os.environ if environ is None else environ
    tokens = Tokens(_from_env(env, TOKEN_ENV, cfg.server.token),
                    _from_env(env, VIEWER_TOKEN_ENV, cfg.server.viewer_token))
    if tokens.viewer is not None and tokens.operator is None:
        raise ConfigError(f"[server] viewer_token ({VIEWER_TOKEN_ENV}) needs an operator token too ([server] token "
                          f"or {TOKEN_ENV}): without one, anyone is an operator")
    if tokens.viewer is not None and hmac.compare_digest(tokens.viewer, tokens.operator or ""):
        raise ConfigError("[server] viewer_token must differ from the operator's token")
    return tokens


def effective_token(cfg: AppConfig, environ: dict[str, str] | None = None) -> str | None:
    """The operator's token (``effective_tokens``)."""
    return effective_tokens(cfg, environ).operator


def viewer_refusal(method: str, path: str) -> str | None:
    """Why a viewer may not make this request, or None if it may."""
    if path.startswith(OPERATOR_READS):
        return "teaching data and jobs need the operator token"
    if method in ("GET", "HEAD", "OPTIONS"):
        return None
    if any(method == m and (path == p or (p.endswith("/") and path.startswith(p))) for m, p in VIEWER_WRITES):
        return None
    return (f"{method} {path} needs the operator token: a viewer token may watch and read results, events and "
            "status")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def auth_middleware(tokens: Tokens) -> Middleware:
    """Without an operator token, everyone is an operator; with one, a request needs it or the viewer's."""
    operator = None if tokens.operator is None else tokens.operator.encode()
    viewer = None if tokens.viewer is None else tokens.viewer.encode()

    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        path = request.path
        request[ROLE_KEY] = "operator" if operator is None else "none"
        if operator is None or path in PUBLIC_PATHS or path.startswith(PUBLIC_PREFIXES):
            return await handler(request)
        header = request.headers.get("Authorization", "")
        scheme, _, given_text = header.partition(" ")
        given = given_text.strip().encode()
        # both comparisons always run: the time taken says nothing of which token is near
        is_operator = hmac.compare_digest(given, operator)
        is_viewer = viewer is not None and hmac.compare_digest(given, viewer)
        if scheme.lower() != "bearer" or not (is_operator or is_viewer):
            reason = ("missing Authorization: Bearer TOKEN header" if not header
                      else "wrong token" if scheme.lower() == "bearer" else "use the Bearer scheme")
            return web.json_response({"error": f"unauthorized: {reason}"}, status=401,
                                     headers={"WWW-Authenticate": 'Bearer realm="edge-app"'})
        request[ROLE_KEY] = "operator" if is_operator else "viewer"
        refusal = None if is_operator else viewer_refusal(request.method, path)
        if refusal is not None:
            return web.json_response({"error": f"forbidden: {refusal}"}, status=403)
        return await handler(request)

    return check


async def role(request: web.Request) -> web.Response:
    """``GET /api/role``: ``{"role": "operator" | "viewer"}`` (the page hides what a viewer may not do)."""
    return web.json_response({"role": request.get(ROLE_KEY, "operator")})


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


def client_address(request: web.Request, trusted_proxies: list[str]) -> str:
    """The client a request comes from: the last hop of ``X-Forwarded-For`` when the request comes from a trusted
    proxy (``[server] trusted_proxies``: the load balancer in front of the boxes), else the peer's address."""
    remote = request.remote or "unknown"
    if remote in trusted_proxies:
        hops = [h.strip() for h in request.headers.get("X-Forwarded-For", "").split(",") if h.strip()]
        if hops:
            return hops[-1]
    return remote


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
