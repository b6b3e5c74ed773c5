"""A segment that raises at run time (ONNX Runtime's own error) costs depth, not the answer or the session.

The model folder is the default one with segment 2 replaced by a graph of the same inputs and outputs
whose Gather indexes out of bounds: it loads and validates, and fails on every run.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import onnx
import pytest
from aiortc import RTCPeerConnection
from onnx import TensorProto, helper
from test_live_session import VideoFileTrack, collect, connect

from edge_app.bench.testvideo import LabelledVideo
from edge_app.config import AppConfig
from edge_app.decision.scheduler import FrameScheduler
from models.errors import SegmentRunError
from models.policies import FixedExit
from models.runtime import ModelRuntime
from models.service import InferenceService

DEFAULT = Path(__file__).resolve().parents[1] / "models" / "default"


def _failing_segment(spec: dict[str, Any]) -> onnx.ModelProto:
    inp, feat, logits = spec["input"], spec["features"], spec["logits"]
    n_classes = logits["shape"][1]
    nodes = [
        helper.make_node("Constant", [], ["fshape"], value=helper.make_tensor("fs", TensorProto.INT64,
                                                                              [4], feat["shape"])),
        helper.make_node("ConstantOfShape", ["fshape"], [feat["name"]],
                         value=helper.make_tensor("zero", TensorProto.FLOAT, [1], [0.0])),
        helper.make_node("ReduceSum", [inp["name"]], ["total"], keepdims=0),
        helper.make_node("Mul", ["total", "zero_f"], ["nothing"]),
        helper.make_node("Add", ["nothing", "far"], ["far_f"]),
        helper.make_node("Cast", ["far_f"], ["idx"], to=TensorProto.INT64),  # data-dependent, so not folded away
        helper.make_node("Gather", ["table", "idx"], [logits["name"]], axis=1),
    ]
    inits = [helper.make_tensor("zero_f", TensorProto.FLOAT, [], [0.0]),
             helper.make_tensor("far", TensorProto.FLOAT, [n_classes], [1e6] * n_classes),
             helper.make_tensor("table", TensorProto.FLOAT, [1, 20], [0.0] * 20)]
    graph = helper.make_graph(
        nodes, "failing", [helper.make_tensor_value_info(inp["name"], TensorProto.FLOAT, inp["shape"])],
        [helper.make_tensor_value_info(feat["name"], TensorProto.FLOAT, feat["shape"]),
         helper.make_tensor_value_info(logits["name"], TensorProto.FLOAT, logits["shape"])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.fixture(scope="module")
def broken_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("broken") / "model"
    shutil.copytree(DEFAULT, folder)
    manifest = json.loads((folder / "manifest.json").read_text())
    spec = manifest["exits"][1]
    onnx.save(_failing_segment(spec), folder / spec["file"])
    spec["sha256"] = hashlib.sha256((folder / spec["file"]).read_bytes()).hexdigest()
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return folder


def test_the_scheduler_answers_from_the_exit_before_the_failing_segment(broken_model: Path) -> None:
    rt = ModelRuntime.load(broken_model, providers=["cpu"], warmup=0)
    x = rt.preprocess(np.random.default_rng(0).integers(0, 256, (240, 320, 3), dtype=np.uint8))
    with pytest.raises(SegmentRunError, match=r"segment 2 \(segment2.onnx\) failed"):
        run = rt.start(x)
        run.advance()
        run.advance()
    d = FrameScheduler(InferenceService(rt), FixedExit(3), max_depth_step=3).analyse_now(x, 1e6)
    assert d.exits_run == 1 and d.exit_index == 0 and d.result.exit_index == 0
    assert d.error is not None and "segment 2 (segment2.onnx) failed" in d.error and "Gather" in d.error


@pytest.mark.slow
async def test_a_failing_segment_does_not_end_the_session(broken_model: Path, app_config: Callable[..., AppConfig],
                                                          serve: Any, demo_test_split: tuple[np.ndarray, np.ndarray]
                                                          ) -> None:
    images, labels = demo_test_split
    results: list[dict[str, Any]] = []
    cfg = app_config(model={"path": str(broken_model), "warmup_runs": 0}, policy={"kind": "fixed", "fixed_exit": 3})
    async with serve(cfg) as base:
        pc = RTCPeerConnection()
        tasks: list[asyncio.Task[None]] = []
        try:
            pc.addTrack(VideoFileTrack(LabelledVideo(images[:20], labels[:20], hold=3)))
            collect(pc, results, [], tasks)
            await connect(base, pc)
            for _ in range(300):
                if len(results) >= 60:
                    break
                await asyncio.sleep(0.1)
            async with aiohttp.ClientSession() as http, http.get(f"{base}/metrics") as r:
                metrics = await r.text()
            state = pc.connectionState
        finally:
            for t in tasks:
                t.cancel()
            await pc.close()
    assert len(results) >= 60 and state == "connected", (len(results), state)
    assert all(r["exit"] == 1 and r["exits_run"] == 1 and "segment 2" in r["error"] for r in results[-30:])
    errors = [ln for ln in metrics.splitlines() if ln.startswith('edge_analysis_errors_total{source="browser"}')]
    assert errors and float(errors[0].split()[-1]) >= 60, errors
