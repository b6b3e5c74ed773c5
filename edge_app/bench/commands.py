"""The benchmarks' and offline tools' subcommands: ``edge-app bench-model``, ``bench-policy``, ``bench-pipeline``,
``bench-smoothing``, ``bench-sessions``, ``bench-network``, ``bench-soak``, ``bench-batching``, ``bench-overload``,
``bench-viewers``, ``bench-teach``, ``evaluate``, ``compare-policies``, ``codec-traces``, ``clip-traces``,
``compare-video``.

``edge_app.cli`` adds them to its parser for every command but ``serve``; each imports its module only when it runs.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from edge_app.config import DEFAULT_CONFIG, load_config
from edge_app.factory import CODEC_KBPS, DEMO_TEST_SPLIT, inference_service, load_runtime, model_args, model_dir


def plots_missing() -> bool:
    """True (after saying what to install) when matplotlib, which draws the benchmarks' plots, is absent."""
    import importlib.util

    if importlib.util.find_spec("matplotlib") is None:
        print("error: this command draws plots with matplotlib: install the bench extra (pip install -e "
              "'.[bench]')", file=sys.stderr)
        return True
    return False


def cmd_bench_model(args: argparse.Namespace) -> int:
    from edge_app.bench.model import bench_model, format_table

    cfg = load_config(args.config)
    rt = load_runtime(cfg, args.threads, args.model)
    print(f"model {rt.manifest.name} from {rt.folder} on {rt.providers}, "
          f"intra-op threads {args.threads if args.threads is not None else cfg.model.threads} (0 = default), "
          f"{args.frames} frames")
    print(format_table(bench_model(rt, frames=args.frames)))
    return 0

def cmd_bench_events(args: argparse.Namespace) -> int:
    import asyncio

    from edge_app.bench import events

    cfg = load_config(args.config)
    parts = set(args.part)

    async def go() -> None:
        if "cpu" in parts:
            service = inference_service(cfg)
            service.start()
            try:
                npz = DEMO_TEST_SPLIT if DEMO_TEST_SPLIT.is_file() else None
                print(await events.bench_cpu(cfg, service, npz, args.pairs, args.run_s), flush=True)
            finally:
                await service.stop()
        if "store" in parts:
            print(await events.bench_store(args.rate, args.store_s), flush=True)
        if "api" in parts:
            print(await events.bench_api(args.api_events, args.requests), flush=True)

    asyncio.run(go())
    return 0


def cmd_bench_triton(args: argparse.Namespace) -> int:
    import asyncio

    from edge_app.bench import triton
    from edge_app.factory import deployed_model

    if not DEMO_TEST_SPLIT.is_file():
        print(f"error: needs the demo test split {DEMO_TEST_SPLIT} (edge-app export makes it)", file=sys.stderr)
        return 2
    model = deployed_model(load_config(args.config))
    if args.paced:
        providers = tuple(p.strip() for p in args.providers.split(",") if p.strip())
        print(asyncio.run(triton.paced_run(model, DEMO_TEST_SPLIT, args.paced_seconds, providers)))
        return 0
    print(asyncio.run(triton.run(model, DEMO_TEST_SPLIT, args.frames, args.blocks, args.seconds, args.streams)))
    return 0


def cmd_bench_pipeline(args: argparse.Namespace) -> int:
    import asyncio

    from edge_app.bench.pipeline import run

    cfg = load_config(args.config)
    service = inference_service(cfg)
    npz = args.video
    if npz is None and DEMO_TEST_SPLIT.is_file():
        npz = DEMO_TEST_SPLIT

    async def both_modes() -> str:
        service.start()
        try:
            return await run(cfg, service, args.duration, args.window, npz)
        finally:
            await service.stop()

    print(asyncio.run(both_modes()))
    return 0

def cmd_bench_smoothing(args: argparse.Namespace) -> int:
    from edge_app.bench.smoothing import bench_smoothing

    cfg = load_config(args.config)
    if not args.video.is_file():
        print(f"error: {args.video}: no such demo split; build it with: python -m exporter data", file=sys.stderr)
        return 2
    print(bench_smoothing(cfg, load_runtime(cfg), args.video, seconds=args.seconds, hold_s=args.hold))
    return 0

def _traces_written(folder: Path, write: Callable[[], dict[str, Any]], then: str) -> int:
    """Write a model folder's traces; one line on what was written (or on the data that is missing)."""
    try:
        written = write()
    except FileNotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {', '.join(s.file for s in written.values())} and listed them in {folder / 'manifest.json'}; "
          f"{then} with: edge-app fit-policy --model {folder}")
    return 0


def cmd_codec_traces(args: argparse.Namespace) -> int:
    from edge_app.bench.codec_traces import write_codec_traces

    folder = model_dir(args)
    return _traces_written(folder, lambda: write_codec_traces(folder, args.data, args.kbps, args.hold,
                                                              height=args.height), "refit the policy on them")


def cmd_clip_traces(args: argparse.Namespace) -> int:
    from edge_app.bench.clips import write_clip_traces

    folder = model_dir(args)
    return _traces_written(folder, lambda: write_clip_traces(folder, args.data), "fit exit 0 on them")


def cmd_compare_video(args: argparse.Namespace) -> int:
    from edge_app.bench.video_compare import compare_video

    compare_video(model_dir(args), args.out, args.resamples)
    print(f"\nwrote {args.out / 'compare-video.md'} and {args.out / 'compare-video.json'}")
    return 0


def cmd_bench_slow_device(args: argparse.Namespace) -> int:
    from edge_app.bench.slow_device import bench_slow_device

    try:
        print(bench_slow_device(model_dir(args), args.data, args.seconds, args.fps))
    except FileNotFoundError as exc:  # the demo data (edge_app.bench.codec_traces.demo_split says how to build it)
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


def cmd_bench_models(args: argparse.Namespace) -> int:
    from edge_app.bench.models import bench_models

    print(bench_models(model_dir(args), args.loads, args.extra))
    return 0


def cmd_evaluate(args: argparse.Namespace) -> int:
    if plots_missing():
        return 2
    from edge_app.bench.evaluate import evaluate

    res = evaluate(model_dir(args), args.out, bins=args.bins, loss_kind=args.loss_kind, traces=args.traces)
    print(res["table"])
    print(f"\nwrote {args.out / 'table.txt'}, {args.out / 'pareto.png'}, {args.out / 'points.json'}")
    return 0

def cmd_compare_policies(args: argparse.Namespace) -> int:
    from edge_app.bench.policy_compare import VARIANTS, compare_policies

    unknown = [v for v in args.variant or [] if v not in VARIANTS]
    if unknown:
        print(f"error: unknown --variant {unknown}; choose from {list(VARIANTS)}")
        return 2
    compare_policies(model_dir(args), args.out, args.resamples, args.traces, args.variant)
    print(f"\nwrote {args.out / 'compare.md'} and {args.out / 'compare.json'}")
    return 0


def cmd_bench_policy(args: argparse.Namespace) -> int:
    from edge_app.bench.model import bench_policy

    print(bench_policy(model_dir(args), frames=args.frames))
    return 0

def cmd_bench_sessions(args: argparse.Namespace) -> int:
    if plots_missing():
        return 2
    from edge_app.bench.sessions import bench_compare, bench_sessions

    cfg = load_config(args.config)
    try:
        if args.compare:
            print(bench_compare(cfg.model_path.resolve(), args.max_sessions, args.compare, args.window, args.video,
                                args.out))
            return 0
        bench_sessions(cfg.model_path.resolve(), args.max_sessions, args.window, args.video, args.out, args.cameras,
                       args.results_only, args.workers, args.peer_processes, args.pre_encoded)
    except FileNotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"report.json, sessions.png and the server log under {args.out}/")
    return 0

def cmd_bench_soak(args: argparse.Namespace) -> int:
    from edge_app.bench.soak import bench_soak

    cfg = load_config(args.config)
    print(f"soak: {args.offers} offers that never connect over {args.seconds:.0f} s, max_sessions "
          f"{args.max_sessions}, connect_timeout_s {args.connect_timeout:g}", flush=True)
    report = bench_soak(cfg.model_path, args.offers, args.seconds, args.max_sessions, args.connect_timeout, args.out)
    print(report.table())
    problems = report.problems()
    print("\n".join(f"FAIL: {p}" for p in problems) or "OK: no session left, no growth beyond noise, and a real "
          f"client connected afterwards ({args.out / 'report.json'})")
    return 1 if problems else 0

def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: at least 1")
    return value

def _segment_ms(text: str) -> tuple[float, float, float] | None:
    if text == "off":
        return None
    try:
        ms = tuple(float(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: three comma-separated milliseconds, or off") from None
    if len(ms) != 3 or min(ms) <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: three positive milliseconds (A,B,C), or off")
    return ms

def cmd_bench_network(args: argparse.Namespace) -> int:
    if plots_missing():
        return 2
    from edge_app.bench.netbench.bench import POLICIES, BenchOptions, bench_network
    from edge_app.bench.netbench.netns import NetnsUnavailable
    from edge_app.bench.netbench.trace import TraceError

    policies = args.policy or list(POLICIES)
    if unknown := [p for p in policies if p not in POLICIES]:
        print(f"error: unknown --policy {unknown}; choose from {list(POLICIES)}", file=sys.stderr)
        return 2
    opts = BenchOptions(total_budget_ms=args.total_budget_ms, safety_margin_ms=args.safety_margin_ms,
                        segment_ms=args.segment_ms, lead_s=args.lead, video_images=args.video_images)
    traces = args.trace or ["step", "bursty", "ratecap", "cellular"]
    if args.retabulate:
        from edge_app.bench.netbench.bench import retabulate

        retabulate(args.out, traces, policies, opts)
        return 0
    try:
        bench_network(traces, policies, opts, args.out)
    except (NetnsUnavailable, FileNotFoundError, TraceError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"per-frame CSV, time series PNGs and summaries under {args.out}/")
    return 0


def cmd_bench_batching(args: argparse.Namespace) -> int:
    import asyncio

    from edge_app.bench.batching import bench

    cfg = load_config(args.config)
    print(asyncio.run(bench(cfg, args.streams, args.seconds, args.window_ms, args.fps, args.threads)))
    return 0


def cmd_bench_overload(args: argparse.Namespace) -> int:
    import asyncio

    from edge_app.bench.overload import bench

    cfg = load_config(args.config)
    segment_ms = [float(v) for v in args.segment_ms.split(",")]
    print(asyncio.run(bench(cfg, args.streams, args.seconds, segment_ms)))
    return 0


def cmd_bench_uplink_size(args: argparse.Namespace) -> int:
    from edge_app.bench.uplink_size import bench_uplink_size

    if not args.data.is_file():
        print(f"error: {args.data} is missing: build the demo data with 'python -m exporter data --out data/demo'",
              file=sys.stderr)
        return 2
    print(bench_uplink_size(model_dir(args), args.data))
    return 0


def cmd_bench_viewers(args: argparse.Namespace) -> int:
    import asyncio

    from edge_app.bench.viewers import bench

    cfg = load_config(args.config)
    npz = DEMO_TEST_SPLIT if DEMO_TEST_SPLIT.is_file() else None
    print(asyncio.run(bench(cfg.model_path.resolve(), args.viewers, args.window, npz, args.out)))
    return 0


def cmd_bench_teach(args: argparse.Namespace) -> int:
    import asyncio

    from edge_app.bench.teach_live import bench

    print(asyncio.run(bench(model_dir(args).resolve(), args.rounds, args.out.resolve(),
                            not args.no_region, epochs=args.epochs, nights=args.nights)))
    return 0


def add_tool_commands(sub: Any) -> None:
    """The benchmarks and offline tools' subcommands (``edge-app bench-*``, ``evaluate``, ``codec-traces``)."""
    bb = sub.add_parser("bench-batching", help="the inference service frame by frame vs batched across streams")
    bb.add_argument("--config", type=Path, default=DEFAULT_CONFIG)
    bb.add_argument("--streams", type=int, default=8)
    bb.add_argument("--seconds", type=float, default=10.0)
    bb.add_argument("--window-ms", type=float, default=2.0, help="the batch window of the batched run")
    bb.add_argument("--fps", type=float, default=30.0, help="each stream's rate in the open-loop run")
    bb.add_argument("--threads", type=int, help="intra-op threads (default [model] threads)")
    bb.set_defaults(func=cmd_bench_batching)
    bo = sub.add_parser("bench-overload", help="more streams than full depth allows: fixed vs load-adaptive "
                                                "operating point")
    bo.add_argument("--config", type=Path, default=DEFAULT_CONFIG)
    bo.add_argument("--streams", type=int, default=6)
    bo.add_argument("--seconds", type=float, default=20.0)
    bo.add_argument("--segment-ms", default="4,4,4", help="the emulated device's segment times")
    bo.set_defaults(func=cmd_bench_overload)
    bv = sub.add_parser("bench-viewers", help="server CPU of a camera with 1 and N video viewers: its own H.264 "
                                              "forwarded, encoded once for all of them, once per viewer")
    bv.add_argument("--config", type=Path, default=DEFAULT_CONFIG)
    bv.add_argument("--viewers", type=int, default=4)
    bv.add_argument("--window", type=float, default=10.0)
    bv.add_argument("--out", type=Path, default=Path("artifacts/bench-viewers"))
    bv.set_defaults(func=cmd_bench_viewers)
    bu = sub.add_parser("bench-uplink-size", help="accuracy per exit with frames sent at 640x480 and at the smaller "
                                                  "size a results-only browser is asked for, with intervals")
    bu.add_argument("--config", type=Path, default=DEFAULT_CONFIG)
    bu.add_argument("--model", type=Path, help="model folder (default: [model] path of the config)")
    bu.add_argument("--data", type=Path, default=DEMO_TEST_SPLIT, help="demo split .npz")
    bu.set_defaults(func=cmd_bench_uplink_size)
    bt = sub.add_parser("bench-teach", help="teach a hard scene through the API of a served app, as a user would: "
                                             "the accuracy shown before deploy against the live accuracy after it")
    bt.add_argument("--config", type=Path, default=DEFAULT_CONFIG)
    bt.add_argument("--model", type=Path, help="the model to start from (default: [model] path of the config)")
    bt.add_argument("--rounds", type=int, default=3, help="independent trainings, each from the model")
    bt.add_argument("--epochs", type=int, default=12)
    bt.add_argument("--no-region", action="store_true", help="leave the camera without a region (the centre square)")
    bt.add_argument("--nights", action="store_true", help="check and live clips alternate with the camera's night "
                    "mode (grayscale, dim, noisy), which the training recordings never show")
    bt.add_argument("--out", type=Path, default=Path("artifacts/bench-teach"))
    bt.set_defaults(func=cmd_bench_teach)
    b = sub.add_parser("bench-model", help="per-segment latency and pre-processing time")
    model_args(b)
    b.add_argument("--frames", type=int, default=300)
    b.add_argument("--threads", type=int, help="override [model] threads")
    b.set_defaults(func=cmd_bench_model)
    v = sub.add_parser("evaluate", help="replay every policy on the test traces: table, Pareto plot, JSON")
    model_args(v)
    v.add_argument("--out", type=Path, default=Path("artifacts/evaluate"))
    v.add_argument("--bins", type=int, default=8)
    v.add_argument("--loss-kind", choices=["error", "one-minus-confidence"],
                   help="node loss of the dynamic index (default: that of the model's policy.json)")
    v.add_argument("--traces", choices=["auto", "clean", "vp8"], default="auto",
                   help="calibration and test traces: clean or VP8-coded frames (auto: vp8 when the model has them)")
    v.set_defaults(func=cmd_evaluate)
    cp = sub.add_parser("compare-policies", help="the dynamic index against tuned thresholds: Pareto fronts with "
                        "paired-bootstrap intervals, at the measured segment costs and with segment 3 dearer")
    model_args(cp)
    cp.add_argument("--out", type=Path, default=Path("artifacts/compare-policies"))
    cp.add_argument("--resamples", type=int, default=1000)
    cp.add_argument("--traces", choices=["auto", "clean", "vp8"], default="auto")
    cp.add_argument("--variant", action="append", help="index state variant, repeatable (default: all)")
    cp.set_defaults(func=cmd_compare_policies)
    ct = sub.add_parser("codec-traces", help="softmax traces of calibration and test frames after a VP8 round trip")
    model_args(ct)
    ct.add_argument("--data", type=Path, default=Path("data/demo"),
                    help="demo data folder with calibration.npz and test.npz (python -m exporter data)")
    ct.add_argument("--kbps", type=float, default=CODEC_KBPS,
                    help="VP8 bitrate (default 250: [budget] min_receive_kbps, the worst the browser is asked for)")
    ct.add_argument("--hold", type=int, default=3, help="frames each image stays on screen (as bench-network's video)")
    ct.add_argument("--height", type=int, default=480, choices=[192, 240, 360, 480, 720],
                    help="frame height (4:3); a browser sends less when short of bits (bench-network: mostly 240)")
    ct.set_defaults(func=cmd_codec_traces)
    cl = sub.add_parser("clip-traces", help="labelled video in time order (states held 10-120 s, noise, light drift, "
                        "passers-by; VP8 and H.264) through the model: the clips exit 0 is fitted and compared on")
    model_args(cl)
    cl.add_argument("--data", type=Path, default=Path("data/demo"),
                    help="demo data folder with calibration.npz and test.npz (python -m exporter data)")
    cl.set_defaults(func=cmd_clip_traces)
    cv = sub.add_parser("compare-video", help="the index with exit 0 against a per-frame threshold, a tuned motion "
                        "gate + threshold and a fixed refresh on the test clips: fronts with block-bootstrap "
                        "intervals, time to notice a change")
    model_args(cv)
    cv.add_argument("--out", type=Path, default=Path("artifacts/compare-video"))
    cv.add_argument("--resamples", type=int, default=1000)
    cv.set_defaults(func=cmd_compare_video)
    sd = sub.add_parser("bench-slow-device", help="a static-dominated camera at 30 fps on an emulated 25/25/25 ms "
                        "device: every frame answered on time, accuracy as served, exit 0's share, per policy")
    model_args(sd)
    sd.add_argument("--data", type=Path, default=Path("data/demo"), help="demo data folder with test.npz")
    sd.add_argument("--seconds", type=float, default=120.0)
    sd.add_argument("--fps", type=float, default=30.0)
    sd.set_defaults(func=cmd_bench_slow_device)
    bm = sub.add_parser("bench-models", help="every camera its own model: memory per extra model, and the other "
                        "cameras' p99 latency while a model loads")
    model_args(bm)
    bm.add_argument("--loads", type=int, default=30, help="deploys on the third camera")
    bm.add_argument("--extra", type=int, default=4, help="extra models loaded and kept for the memory figure")
    bm.set_defaults(func=cmd_bench_models)
    bp = sub.add_parser("bench-policy", help="per-frame decision overhead of each policy vs segment cost")
    model_args(bp)
    bp.add_argument("--frames", type=int, default=2000)
    bp.set_defaults(func=cmd_bench_policy)
    bl = sub.add_parser("bench-pipeline", help="the live path at 640x480 30 fps, watched as video and through "
                                               "results only: stages, latency, CPU, drops, memory")
    bl.add_argument("--config", type=Path, default=DEFAULT_CONFIG)
    bl.add_argument("--duration", type=float, default=30.0, help="seconds per mode (video, then results only)")
    bl.add_argument("--window", type=float, default=10.0, help="seconds per reported window")
    bl.add_argument("--video", type=Path, help="demo split .npz for the frames (default: data/demo/test.npz if "
                                                "present, else synthetic frames)")
    bl.set_defaults(func=cmd_bench_pipeline)
    be = sub.add_parser("bench-events", help="what events cost: pipeline CPU with the store, MQTT and a webhook "
                                             "off and on; 1,000 events/s into the store (loop lag); GET /api/events")
    be.add_argument("--config", type=Path, default=DEFAULT_CONFIG)
    be.add_argument("--part", nargs="+", choices=["cpu", "store", "api"], default=["cpu", "store", "api"])
    be.add_argument("--pairs", type=int, default=8, help="cpu: off/on pairs")
    be.add_argument("--run-s", type=float, default=15.0, help="cpu: seconds per run")
    be.add_argument("--rate", type=int, default=1000, help="store: events a second")
    be.add_argument("--store-s", type=float, default=60.0, help="store: seconds")
    be.add_argument("--api-events", type=int, default=100_000, help="api: events in the store")
    be.add_argument("--requests", type=int, default=200, help="api: requests per kind")
    be.set_defaults(func=cmd_bench_events)
    bt = sub.add_parser("bench-triton", help="the shared Triton server against the local runner: per-frame overhead "
                                             "(gRPC, shared memory), batches with many streams")
    bt.add_argument("--config", type=Path, default=DEFAULT_CONFIG)
    bt.add_argument("--frames", type=int, default=200, help="overhead: frames per block")
    bt.add_argument("--blocks", type=int, default=3, help="overhead: blocks per mode, taken in turns")
    bt.add_argument("--seconds", type=float, default=10.0, help="streams: seconds per runner")
    bt.add_argument("--streams", type=int, default=8)
    bt.add_argument("--paced", action="store_true", help="instead: the most 30 fps streams at 99 %% on time, local "
                    "and Triton, batched and not")
    bt.add_argument("--paced-seconds", type=float, default=4.0, help="paced: seconds per try")
    bt.add_argument("--providers", default="cpu", help="paced: ONNX Runtime providers on both sides (cuda,cpu on a "
                    "GPU box)")
    bt.set_defaults(func=cmd_bench_triton)
    bs = sub.add_parser("bench-smoothing", help="label flips and quality jumps with temporal smoothing off and on")
    bs.add_argument("--config", type=Path, default=DEFAULT_CONFIG)
    bs.add_argument("--video", type=Path, default=DEMO_TEST_SPLIT, help="demo split .npz")
    bs.add_argument("--seconds", type=float, default=120.0)
    bs.add_argument("--hold", type=float, default=1.0, help="seconds each image stays in view")
    bs.set_defaults(func=cmd_bench_smoothing)
    bss = sub.add_parser("bench-sessions", help="concurrent browser-like sessions: per-session rate and latency "
                                                "as they are added, and the refusal beyond max_sessions")
    bss.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help="for the model path")
    bss.add_argument("--max-sessions", type=int, default=4)
    bss.add_argument("--window", type=float, default=10.0, help="seconds measured at each count")
    bss.add_argument("--video", type=Path, default=DEMO_TEST_SPLIT, help="demo split .npz (synthetic if absent)")
    bss.add_argument("--cameras", type=int, default=0, help="RTSP test cameras analysed at the same time")
    bss.add_argument("--results-only", action="store_true", help="peers that get results only (sendonly, the "
                     "page's default) instead of annotated video back")
    bss.add_argument("--compare", type=int, metavar="N", help="annotated video back up to --max-sessions, then "
                     "results only up to N sessions, in one run; prints both and the ratios")
    bss.add_argument("--workers", type=int, default=1, help="serve --workers N (media workers behind a control "
                                                             "process)")
    bss.add_argument("--peer-processes", type=int, default=1, help="processes the test peers are spread over")
    bss.add_argument("--pre-encoded", action="store_true", help="peers send the clip encoded once to VP8 instead "
                     "of encoding every frame (browsers elsewhere, or hardware encoders)")
    bss.add_argument("--out", type=Path, default=Path("artifacts/bench-sessions"))
    bss.set_defaults(func=cmd_bench_sessions)
    nb = sub.add_parser("bench-network", help="every policy through Chromium and a trace-impaired network path "
                                              "(root: network namespaces)")
    nb.add_argument("--trace", action="append", default=None,
                    help="trace CSV or shipped name (steady, step, bursty, bursty-lossy, drift, ratecap, cellular, "
                         "short-step, short-ratecap), "
                         "or loopback (this machine, no namespaces or bridge); repeatable (default: step, bursty, "
                         "ratecap, cellular)")
    nb.add_argument("--policy", action="append", default=None,
                    help="policy to run, repeatable (default: all; 'as shipped' is config.toml's [policy])")
    nb.add_argument("--total-budget-ms", type=float, default=300.0, help="the deadline, stamping to result")
    nb.add_argument("--safety-margin-ms", type=float, default=40.0,
                    help="[budget] safety_margin_ms: covers the browser's encode and the server's decode, which "
                         "the server cannot see (measured here: ~40 ms at p50)")
    nb.add_argument("--segment-ms", type=_segment_ms, default=(25.0, 25.0, 25.0), metavar="A,B,C",
                    help="emulated device (python -m edge_app.bench.serve): pad the three segments to these times "
                         "(default 25,25,25: "
                         "exits sit at thirds of the FLOPs; full depth 75 ms fits a 20 ms RTT, not a 150 ms "
                         "one); off: the model at this CPU's real speed")
    nb.add_argument("--lead", type=float, default=8.0,
                    help="seconds from the app listening to the trace starting (browser start, connection, settling)")
    nb.add_argument("--video-images", type=_positive_int, default=600,
                    help="demo test images in the fake camera's video, 3 frames each (fewer: a noisier accuracy)")
    nb.add_argument("--out", type=Path, default=Path("artifacts/bench-network"))
    nb.add_argument("--retabulate", action="store_true",
                    help="only redo tables and plots from the per-frame CSVs already under --out")
    nb.set_defaults(func=cmd_bench_network)
    sk = sub.add_parser("bench-soak", help="offers that never connect against a real server: sessions, threads, "
                                           "fds and RSS over time, then a real client")
    sk.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help="for the model path")
    sk.add_argument("--offers", type=_positive_int, default=200)
    sk.add_argument("--seconds", type=float, default=120.0, help="spread the offers over this long")
    sk.add_argument("--max-sessions", type=_positive_int, default=4)
    sk.add_argument("--connect-timeout", type=float, default=15.0, help="[server] connect_timeout_s")
    sk.add_argument("--out", type=Path, default=Path("artifacts/bench-soak"))
    sk.set_defaults(func=cmd_bench_soak)
