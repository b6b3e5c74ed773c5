"""``python -m edge_app.bench.serve``: ``edge-app serve`` on an emulated slower device (benchmarks only).

    python -m edge_app.bench.serve --config F --segment-ms 25,25,25 [--host H] [--port P]
    python -m edge_app.bench.serve --config F --slowdown 5

The network benchmark runs the app this way, so that full depth costs what it would on a slower box while the
CPU stays free for the browser and the bridge (``edge_app.bench.emulation``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from edge_app.config import AppConfig, ConfigError, load_config
from edge_app.serving import serve, setup_logging
from models.errors import ModelError
from models.service import InferenceService


def emulated_service(segment_ms: list[float] | None, slowdown: float):  # type: ignore[no-untyped-def]
    def make(cfg: AppConfig) -> InferenceService:
        from edge_app.bench.emulation import EmulatedDevice
        from models.runtime import ModelRuntime

        m = cfg.model
        rt = ModelRuntime.load(cfg.model_path, providers=m.providers, threads=m.threads, warmup=m.warmup_runs,
                               device_id=m.cuda_device)
        return InferenceService(EmulatedDevice(rt, segment_ms, slowdown), m.workers, m.cost_window)

    return make


def segment_list(text: str) -> list[float]:
    try:
        return [float(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: comma-separated milliseconds") from None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m edge_app.bench.serve", description=__doc__.splitlines()[0])
    p.add_argument("--config", type=Path, default=Path("config.toml"))
    p.add_argument("--host")
    p.add_argument("--port", type=int)
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--segment-ms", type=segment_list, help="pad segment k to this many ms (A,B,C)")
    g.add_argument("--slowdown", type=float, help="pad each segment to this many times its exported cost")
    p.add_argument("-v", "--verbose", action="store_true")
    args = p.parse_args(argv)
    setup_logging(args.verbose)
    try:
        cfg = load_config(args.config)
        return serve(cfg, args.host, args.port, emulated_service(args.segment_ms, args.slowdown or 1.0))
    except (ConfigError, ModelError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
