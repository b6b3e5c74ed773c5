"""``edge-app``: serve, export, bench-model."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from edge_app.config import DEFAULT_CONFIG, AppConfig, ConfigError, load_config
from models.errors import ModelError

log = logging.getLogger("edge_app")


def _load(path: Path) -> AppConfig:
    return load_config(path)


def _runtime(cfg: AppConfig, threads: int | None = None):  # type: ignore[no-untyped-def]
    from models.runtime import ModelRuntime

    return ModelRuntime.load(cfg.model_path, providers=cfg.model.providers,
                             threads=cfg.model.threads if threads is None else threads,
                             warmup=cfg.model.warmup_runs, cost_window=cfg.model.cost_window)


def cmd_serve(args: argparse.Namespace) -> int:
    from aiohttp import web

    from edge_app.server import create_app

    cfg = _load(args.config)
    host = args.host or cfg.server.host
    port = cfg.server.port if args.port is None else args.port
    rt = _runtime(cfg)
    app = create_app(cfg, rt)
    log.info("serving on http://%s:%d/ (model %s on %s)", host, port, rt.manifest.name, rt.providers)
    web.run_app(app, host=host, port=port, print=None, shutdown_timeout=cfg.server.shutdown_timeout_s)
    return 0


def cmd_bench_model(args: argparse.Namespace) -> int:
    from edge_app.bench import bench_model, format_table

    cfg = _load(args.config)
    rt = _runtime(cfg, args.threads)
    print(f"model {rt.manifest.name} from {rt.folder} on {rt.providers}, "
          f"intra-op threads {args.threads if args.threads is not None else cfg.model.threads} (0 = default), "
          f"{args.frames} frames")
    print(format_table(bench_model(rt, frames=args.frames)))
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    try:
        from exporter.__main__ import main as exporter_main
    except ImportError as exc:
        print(f"error: the exporter needs the training extra ({exc}); install it with: pip install -e '.[train]'",
              file=sys.stderr)
        return 2
    return exporter_main(args.rest or ["all"])


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="edge-app", description="Latency-adaptive early-exit video analytics.")
    ap.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serve", help="run the server")
    s.add_argument("--config", type=Path, default=DEFAULT_CONFIG)
    s.add_argument("--host", help="override [server] host")
    s.add_argument("--port", type=int, help="override [server] port")
    s.set_defaults(func=cmd_serve)
    b = sub.add_parser("bench-model", help="per-segment latency and pre-processing time")
    b.add_argument("--config", type=Path, default=DEFAULT_CONFIG)
    b.add_argument("--frames", type=int, default=300)
    b.add_argument("--threads", type=int, help="override [model] threads")
    b.set_defaults(func=cmd_bench_model)
    e = sub.add_parser("export", help="build data, train and export a model folder (python -m exporter ...)")
    e.add_argument("rest", nargs=argparse.REMAINDER, help="arguments for python -m exporter (default: all)")
    e.set_defaults(func=cmd_export)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return int(args.func(args))
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except ModelError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
