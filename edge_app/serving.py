"""``edge-app serve``: the app served until a signal (a graceful shutdown; a second signal exits at once), the
listen errors users can act on, and log lines that never carry a secret."""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import signal
import ssl
import sys
import time
from collections.abc import Callable
from typing import Any

from aiohttp import web

from edge_app.config import AppConfig
from edge_app.errors import EdgeAppError
from streams.aiortc_adapter import AiortcInternalsError
from streams.redact import RedactingFilter

log = logging.getLogger(__name__)


class ListenError(EdgeAppError):
    """The server cannot listen on the address asked for; the message says why and what to do."""

    def __init__(self, host: str, port: int, exc: OSError) -> None:
        why = {errno.EADDRINUSE: "the port is already in use (another edge-app, or another program)",
               errno.EACCES: "permission denied (ports below 1024 need root)",
               errno.EADDRNOTAVAIL: f"this machine has no address {host} (check [server] host or --host)"}
        reason = why.get(exc.errno or 0, exc.strerror or str(exc))
        super().__init__(f"cannot listen on {host}:{port}: {reason}; pick another port with --port N or "
                         f"[server] port in the config file")


class ShutdownSignals:
    """SIGTERM/SIGINT once: stop gracefully (``requested`` is set); a second time: ``exit_now`` at once."""

    def __init__(self, exit_now: Callable[[int], None] = os._exit) -> None:
        self.requested = asyncio.Event()
        self._exit_now = exit_now

    def __call__(self, sig: signal.Signals) -> None:
        if self.requested.is_set():
            log.warning("%s again: exiting now, without waiting for the shutdown", sig.name)
            self._exit_now(128 + sig.value)
            return
        log.info("%s: shutting down (send it again to exit at once)", sig.name)
        self.requested.set()

    def install(self, loop: asyncio.AbstractEventLoop) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self, sig)


async def serve_until_signalled(app: web.Application, host: str, port: int, ssl_context: ssl.SSLContext | None,
                                shutdown_timeout_s: float, signals: ShutdownSignals | None = None) -> None:
    """Serve until SIGTERM/SIGINT, then close peers and cameras within ``shutdown_timeout_s`` (plus HTTP)."""
    signals = signals or ShutdownSignals()
    signals.install(asyncio.get_running_loop())
    runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=min(shutdown_timeout_s, 5.0))
    await runner.setup()
    site = web.TCPSite(runner, host, port, ssl_context=ssl_context)
    try:
        await site.start()
    except OSError as exc:
        await runner.cleanup()
        raise ListenError(host, port, exc) from exc
    bound = [s.getsockname()[:2] for s in getattr(site._server, "sockets", None) or []]
    log.info("serving on %s", ", ".join(f"{'https' if ssl_context else 'http'}://{h}:{p}/" for h, p in bound))
    await signals.requested.wait()
    t0 = time.monotonic()
    try:
        await asyncio.wait_for(runner.cleanup(), shutdown_timeout_s + 5.0)
    except TimeoutError:
        log.error("shutdown took over %.0f s; exiting anyway", shutdown_timeout_s + 5.0)
    log.info("stopped in %.2f s", time.monotonic() - t0)


def serve(cfg: AppConfig, host_arg: str | None, port_arg: int | None,
          make_service: Callable[[AppConfig], Any]) -> int:
    """Serve until signalled; ``make_service(cfg)`` builds the inference service (benchmarks pass an emulated one)."""
    import asyncio

    from edge_app.doors.access import TOKEN_ENV, effective_tokens, is_loopback, tls_context
    from edge_app.doors.server import create_app

    host = host_arg or cfg.server.host
    port = cfg.server.port if port_arg is None else port_arg
    tokens = effective_tokens(cfg)
    token = tokens.operator
    tls = tls_context(cfg)
    if not is_loopback(host) and token is None:
        log.warning("serving %s without a token: anyone who can reach it can watch the cameras "
                    "(set [server] token or %s)", host, TOKEN_ENV)
    if not is_loopback(host) and tls is None:
        log.warning("serving %s over plain HTTP: browsers on other machines will refuse the camera "
                    "(set [server] tls_cert and tls_key)", host)
    service = make_service(cfg)
    app = create_app(cfg, service, tokens)
    log.info("model %s on %s; %s", service.backend.manifest.name, service.backend.device_name,
             "no token" if not token else "operator and viewer tokens" if tokens.viewer else "token required")
    try:
        asyncio.run(serve_until_signalled(app, host, port, tls, cfg.server.shutdown_timeout_s))
    except (ListenError, AiortcInternalsError) as exc:  # one line, what to do; no traceback
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


def setup_logging(verbose: bool) -> None:
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for handler in logging.getLogger().handlers:  # no secret reaches a log line, whoever wrote it
        handler.addFilter(RedactingFilter())


def cuda_available() -> bool:
    import onnxruntime as ort

    return "CUDAExecutionProvider" in ort.get_available_providers()


def serve_workers(cfg: AppConfig, config_path: Any, workers: int, host_arg: str | None, port_arg: int | None) -> int:
    """``serve --workers N``: the control process on the public port, N media workers on loopback ports above it."""
    import asyncio
    from pathlib import Path

    from edge_app.doors.access import tls_context
    from edge_app.doors.control import create_control_app
    from edge_app.workers import Supervisor

    host = host_arg or cfg.server.host
    port = cfg.server.port if port_arg is None else port_arg
    base = int(os.environ.get("EDGE_APP_WORKER_BASE_PORT", 0)) or (port + 1 if port else 18400)
    sup = Supervisor(Path(config_path).resolve(), workers, base)
    app = create_control_app(cfg, sup)
    log.info("%d media workers on 127.0.0.1:%d-%d behind this control process", workers, base, base + workers - 1)
    if cfg.model.backend.kind == "onnxruntime" and "cuda" in cfg.model.providers and cuda_available():
        log.warning("serve --workers: each worker runs ONNX Runtime on the CPU (a CUDA session per worker would "
                    "split the GPU %d ways); for the GPU, run edge-app infer-server and set [model.backend] kind = "
                    "\"triton\" (docs/scaling.md)", workers)
    try:
        asyncio.run(serve_until_signalled(app, host, port, tls_context(cfg), cfg.server.shutdown_timeout_s))
    except ListenError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0
