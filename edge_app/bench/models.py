"""``edge-app bench-models``: what each camera's own model costs a box, and whether loading one stalls the others.

A real app (``create_app``: the hub, its cameras, the model set) with three file cameras at 15 fps (a scene of the
project's own, ``edge_app.bench.scene``): two answered by the box's default model, the third by a model of its
own. Model versions are copies of the served model under their own names (separate ONNX Runtime sessions, as taught
models are).

- **Memory per extra model**: the process's resident memory (``VmRSS``) before and after each of ``extra`` more
  models is loaded and warmed up (kept loaded), median of the steps.
- **A load under the others' feet**: ``loads`` times, the third camera is moved to another model (a deploy: load,
  warm-up, switch, unload of the old one); the results of the two other cameras that the model ran on are timed
  (each frame's ``latency_ms``: arrival to result ready; an exit-0 or skipped answer waits on no load), those whose
  frames arrived while a load ran against those of the quiet
  seconds before each load. p99 of each, and their ratio (target: within 10 %).
"""

from __future__ import annotations

import asyncio
import gc
import itertools
import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import av
import cv2
import numpy as np

from edge_app.bench.scene import render
from edge_app.config import load_config
from edge_app.results import AnalysedFrame

FPS = 15


def _rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def _clip(path: Path, seconds: float = 6.0) -> Path:
    rng = np.random.default_rng(0)
    with av.open(str(path), "w") as out:
        stream = out.add_stream("libx264", rate=FPS)
        stream.width, stream.height, stream.pix_fmt = 320, 240, "yuv420p"
        stream.options = {"bf": "0", "g": str(FPS)}
        for i in range(int(seconds * FPS)):
            rgb = render("empty" if (i // FPS) % 2 else "cat", rng)
            img = np.asarray(cv2.resize(rgb, (320, 240), interpolation=cv2.INTER_AREA), np.uint8)
            out.mux(stream.encode(av.VideoFrame.from_ndarray(img, format="rgb24")))
        out.mux(stream.encode(None))
    return path


def _version(models_dir: Path, base: Path, name: str) -> None:
    folder = models_dir / name
    shutil.copytree(base, folder)
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["name"] = name
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=2))


def _config(work: Path, model: Path) -> Path:
    clip = _clip(work / "scene.mp4")
    cams = "".join(f'\n[[cameras]]\nname = "{n}"\nkind = "file"\npath = "{clip}"\n' + (f'model = "{m}"\n' if m else "")
                   for n, m in (("shelf", None), ("gate", None), ("porch", "v0")))
    text = (f'[model]\npath = "{model}"\nwarmup_runs = 3\n\n[training]\nmodels_dir = "{work / "models"}"\n'
            f'data_dir = "{work / "data"}"\n\n[server]\nice_host_addresses = ["127.0.0.1"]\n' + cams)
    path = work / "config.toml"
    path.write_text(text)
    return path


async def _run(model: Path, loads: int, extra: int, quiet_s: float) -> dict[str, Any]:
    from aiohttp import web

    from edge_app.appkeys import HUB_KEY
    from edge_app.doors.server import create_app
    from edge_app.factory import inference_service

    with tempfile.TemporaryDirectory(prefix="bench-models-") as tmp:
        work = Path(tmp)
        for k in range(max(extra, 2) + 1):
            _version(work / "models", model, f"v{k}")
        cfg = load_config(_config(work, model))
        app = create_app(cfg, inference_service(cfg))
        runner = web.AppRunner(app)
        await runner.setup()
        hub = app[HUB_KEY]
        timed: list[tuple[float, float]] = []  # (arrived, latency_ms) of the two cameras that are not moved

        def collect(af: AnalysedFrame) -> None:
            if af.result.skipped is None and not af.result.unchanged:  # a frame the model ran on
                now = time.monotonic()
                timed.append((now - af.result.latency_ms / 1e3, af.result.latency_ms))

        try:
            for name in ("shelf", "gate"):
                hub.registry.camera(name).subscribe(collect, video=False)
            await asyncio.sleep(4.0)  # every camera streaming, every model warm
            gc.collect()
            rss = [_rss_mb()]
            for k in range(1, extra + 1):  # v0 is the porch's; v1.. are loaded and kept
                await hub.models.acquire(f"v{k}", "bench")
                gc.collect()
                rss.append(_rss_mb())
            for k in range(1, extra + 1):
                await hub.models.release(f"v{k}", "bench")
            windows: list[tuple[str, float, float]] = []
            for i in range(loads):
                t0 = time.monotonic()
                await asyncio.sleep(quiet_s)
                windows.append(("quiet", t0, time.monotonic()))
                t1 = time.monotonic()
                await hub.deploy(f"v{1 + i % 2}", "porch")
                windows.append(("load", t1, time.monotonic()))
            await asyncio.sleep(0.5)
        finally:
            await runner.cleanup()
        by = {"quiet": [], "load": []}  # type: dict[str, list[float]]
        for arrived, ms in timed:
            for kind, a, b in windows:
                if a <= arrived < b:
                    by[kind].append(ms)
        load_s = [b - a for kind, a, b in windows if kind == "load"]
        return {"rss_mb": rss, "per_model_mb": [b - a for a, b in itertools.pairwise(rss)],
                "quiet": by["quiet"], "load": by["load"], "load_s": load_s, "cameras": 3, "fps": FPS,
                "input": hub.default.service.backend.manifest.input.width}


def bench_models(model: Path, loads: int = 30, extra: int = 4, quiet_s: float = 2.0) -> str:
    r = asyncio.run(_run(model, loads, extra, quiet_s))
    q, ld = np.asarray(r["quiet"]), np.asarray(r["load"])
    per = np.asarray(r["per_model_mb"])
    p99q, p99l = float(np.percentile(q, 99)), float(np.percentile(ld, 99))
    lines = [f"three file cameras at {r['fps']} fps, the model at {r['input']} px; {len(r['per_model_mb'])} extra "
             f"models loaded and kept; the third camera moved to another model {len(r['load_s'])} times", "",
             f"memory per extra model: median {np.median(per):.1f} MB (steps {', '.join(f'{m:.1f}' for m in per)} "
             f"MB; RSS {r['rss_mb'][0]:.0f} -> {r['rss_mb'][-1]:.0f} MB); target <= 30 MB",
             f"a deploy on one camera (load, warm-up, switch, unload of the old model): median "
             f"{np.median(r['load_s']):.2f} s",
             "",
             "| the two other cameras' frames the model ran on | frames | p50 latency ms | p99 latency ms |",
             "|---|---|---|---|",
             f"| quiet (the {len(r['load_s'])} windows of 2 s before each deploy) | {len(q)} | "
             f"{np.percentile(q, 50):.2f} | {p99q:.2f} |",
             f"| while a model loads on the third camera | {len(ld)} | {np.percentile(ld, 50):.2f} | {p99l:.2f} |",
             "",
             f"p99 while loading / quiet: {p99l / p99q:.2f} (target <= 1.10)"]
    return "\n".join(lines)
