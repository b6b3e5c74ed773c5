"""Export + ONNX parity, model-folder validation, and the segment-by-segment runtime."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="needs the train extra")

from exporter.onnx_export import (  # noqa: E402
    PARITY_ATOL,
    STORED_ATOL,
    check_parity,
    cpu_sessions,
    export_segments,
    run_chain,
)
from exporter.pipeline import load_checkpoint  # noqa: E402
from models.errors import ModelFolderError  # noqa: E402
from models.manifest import read_manifest  # noqa: E402
from models.runtime import ModelRuntime  # noqa: E402

pytestmark = pytest.mark.train


def test_export_writes_a_complete_model_folder(tiny_model_folder: Path) -> None:
    m = read_manifest(tiny_model_folder)
    assert [e.file for e in m.exits] == ["segment1.onnx", "segment2.onnx", "segment3.onnx"]
    assert len(m.class_names) == 11 and m.class_names[-1] == "no digit"
    assert all(e.cpu_cost.median_ms > 0 and e.flops > 0 for e in m.exits)
    assert all(e.cpu_cost.threads == 1 for e in m.exits)  # timed as the app runs them by default ([model] threads)
    assert m.exits[0].backbone_fraction < m.exits[1].backbone_fraction < m.exits[2].backbone_fraction == 1.0
    assert m.provenance["parity_max_abs_diff"] <= PARITY_ATOL  # the float32 graph, before storage
    assert m.provenance["weights_stored_as"] == "float16"
    assert 0 < m.provenance["stored_parity_max_abs_diff"] <= STORED_ATOL
    for split in ("calibration", "test"):
        with np.load(tiny_model_folder / m.traces[split].file) as z:
            probs, labels = z["probs"], z["labels"]
        assert probs.shape == (m.traces[split].count, 3, 11) and labels.shape == (m.traces[split].count,)
        np.testing.assert_allclose(probs.sum(-1), 1.0, atol=1e-5)
    with np.load(tiny_model_folder / m.traces["test"].file) as z:
        acc = (z["probs"].argmax(-1) == z["labels"][:, None]).mean(0)
    assert [e.test_accuracy for e in m.exits] == pytest.approx(acc, abs=1e-4)


def test_onnx_matches_pytorch(tiny_checkpoint: Path, tiny_model_folder: Path, tmp_path: Path) -> None:
    model, _ = load_checkpoint(tiny_checkpoint)
    x = torch.randn(4, 3, 96, 96)
    # the float32 graph the exporter writes first, then the folder's segments, whose weights are stored as float16
    assert check_parity(model, cpu_sessions(export_segments(model, tmp_path / "f32")), x) <= PARITY_ATOL
    stored = cpu_sessions([tiny_model_folder / f"segment{k}.onnx" for k in (1, 2, 3)])
    assert check_parity(model, stored, x, atol=STORED_ATOL) <= STORED_ATOL


def test_float16_storage_halves_the_segments_and_keeps_float32_inference(tiny_checkpoint: Path,
                                                                         tmp_path: Path) -> None:
    import onnx
    from onnx import TensorProto

    from exporter.onnx_export import store_weights_float16

    model, _ = load_checkpoint(tiny_checkpoint)
    paths = export_segments(model, tmp_path)
    x = np.random.default_rng(0).standard_normal((1, 3, 96, 96)).astype(np.float32)
    before = [p.stat().st_size for p in paths]
    ref = run_chain(cpu_sessions(paths), x)
    saved = [store_weights_float16(p) for p in paths]
    assert [b - s for b, s in zip(before, saved, strict=True)] == [p.stat().st_size for p in paths]
    assert sum(saved) > 0.4 * sum(before)  # weights are most of the files; float16 halves them
    graph = onnx.load(str(paths[1])).graph
    conv_weights = {n.input[1] for n in graph.node if n.op_type == "Conv"}
    assert conv_weights and not conv_weights & {i.name for i in graph.initializer}  # no float32 copy is left
    assert {i.data_type for i in graph.initializer if i.name.endswith(".float16")} == {TensorProto.FLOAT16}
    sessions = cpu_sessions(paths)
    assert sessions[0].get_inputs()[0].type == "tensor(float)" and sessions[0].get_outputs()[0].type == "tensor(float)"
    got = run_chain(sessions, x)
    for a, b in zip(ref, got, strict=True):
        np.testing.assert_allclose(b[-1], a[-1], atol=STORED_ATOL)  # logits: only the rounding of the weights
        assert not np.array_equal(a[-1], b[-1])


def test_runtime_gives_the_exported_logits_for_each_exit(tiny_checkpoint: Path, tiny_model_folder: Path) -> None:
    model, _ = load_checkpoint(tiny_checkpoint)
    rt = ModelRuntime.load(tiny_model_folder, providers=["cpu"], warmup=1)
    frame = np.random.default_rng(3).integers(0, 256, (480, 640, 3), dtype=np.uint8)
    x = rt.preprocess(frame)
    with torch.no_grad():
        ref = [lg.softmax(-1)[0].numpy() for lg in model(torch.from_numpy(x))]
    # the export's own segments, as the exporter ran them for the traces (stored weights: exact, not within rounding)
    exported = run_chain(cpu_sessions([tiny_model_folder / e.file for e in rt.manifest.exits]), x)
    run = rt.start(x)
    for k in range(3):
        res = run.advance()
        assert res.exit_index == k
        z = exported[k][-1][0]
        np.testing.assert_allclose(res.probs, np.exp(z - z.max()) / np.exp(z - z.max()).sum(), atol=1e-6)
        np.testing.assert_allclose(res.probs, ref[k], atol=STORED_ATOL)
        assert res.label == int(np.argmax(ref[k])) and res.segment_ms > 0
    assert run.done
    with pytest.raises(IndexError):
        run.advance()


def test_continuing_reuses_the_first_exits_features(tiny_model_folder: Path) -> None:
    rt = ModelRuntime.load(tiny_model_folder, providers=["cpu"], warmup=0)
    x = rt.preprocess(np.full((96, 96, 3), 128, np.uint8))
    run = rt.start(x)
    run.advance()
    feats = run.features.numpy().copy()
    assert list(feats.shape) == rt.manifest.exits[1].input.shape
    assert run.features.device_name().lower() == rt.device
    second = run.advance()
    direct = rt.sessions[1].run(None, {"input": feats})[1][0]
    e = np.exp(direct - direct.max())
    np.testing.assert_allclose(second.probs, e / e.sum(), atol=1e-6)


def test_the_service_runs_the_chain_and_keeps_the_costs(tiny_model_folder: Path) -> None:
    from models.policies import FixedExit
    from models.service import ChainRequest, InferenceService

    rt = ModelRuntime.load(tiny_model_folder, providers=["cpu"], warmup=0)
    service = InferenceService(rt)
    x = rt.preprocess(np.full((96, 96, 3), 128, np.uint8))
    out = service.run_now(ChainRequest(x=x, policy=FixedExit(3), min_exits=1, max_exits=2))
    assert len(out.results) == 2 and out.choice == 1, "the horizon stops the chain before the policy's exit 3"
    assert service.segment_runs == [1, 1, 0], "segment 1 ran once; exit 2 continued from its features"
    assert [c.count for c in service.costs] == [1, 1, 0]
    assert service.costs[0].median_ms == pytest.approx(out.results[0].segment_ms)
    assert rt.device_name == "cpu"


def test_preprocess_matches_the_training_normalisation(tiny_model_folder: Path) -> None:
    from exporter.datasets import normalise_uint8

    rt = ModelRuntime.load(tiny_model_folder, providers=["cpu"], warmup=0)
    img = np.random.default_rng(0).integers(0, 256, (96, 96, 3), dtype=np.uint8)
    np.testing.assert_allclose(rt.preprocess(img), normalise_uint8(img[None]).numpy(), atol=1e-5)
    with pytest.raises(ValueError, match="uint8 RGB"):
        rt.preprocess(np.zeros((96, 96), np.uint8))


def test_cuda_missing_is_loud_only_where_a_gpu_was_expected(tiny_model_folder: Path,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    """The cpu extra with the default ["cuda", "cpu"]: one INFO line. Only "cuda" listed, or the GPU build
    installed: a WARNING."""
    import logging

    import onnxruntime as ort

    from models.runtime import gpu_build_installed

    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("this machine has CUDA; the fallback is not exercised")
    with caplog.at_level(logging.INFO, logger="models.runtime"):
        rt = ModelRuntime.load(tiny_model_folder, providers=["cuda", "cpu"], warmup=0)
    assert rt.providers == ["CPUExecutionProvider"] and rt.device == "cpu"
    warned = [r for r in caplog.records if "CUDA" in r.message and r.levelname == "WARNING"]
    assert bool(warned) == gpu_build_installed(), [r.message for r in caplog.records]
    if not gpu_build_installed():
        assert any("running on the CPU" in r.message and r.levelname == "INFO" for r in caplog.records)
    caplog.clear()
    rt = ModelRuntime.load(tiny_model_folder, providers=["cuda"], warmup=0)
    assert rt.providers == ["CPUExecutionProvider"]
    assert any("CUDA was requested" in r.message and r.levelname == "WARNING" for r in caplog.records)


@pytest.mark.gpu
def test_cuda_keeps_features_on_the_device(tiny_model_folder: Path) -> None:
    import onnxruntime as ort

    if "CUDAExecutionProvider" not in ort.get_available_providers():
        pytest.skip("no CUDAExecutionProvider in this onnxruntime build")
    rt = ModelRuntime.load(tiny_model_folder, providers=["cuda", "cpu"], warmup=1)
    if rt.device != "cuda":
        pytest.skip(f"CUDA provider present but the session runs on {rt.providers}")
    run = rt.start(rt.preprocess(np.zeros((96, 96, 3), np.uint8)))
    run.advance()
    assert run.features.device_name().lower() == "cuda"
    run.advance()
    run.advance()


# --- model-folder validation -------------------------------------------------------------------------------


@pytest.fixture
def model_copy(tiny_model_folder: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "model"
    shutil.copytree(tiny_model_folder, dst)
    return dst


def _edit_manifest(folder: Path, edit) -> None:  # type: ignore[no-untyped-def]
    path = folder / "manifest.json"
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))


def test_missing_folder(tmp_path: Path) -> None:
    with pytest.raises(ModelFolderError, match=r"does not exist.*\[model\] path"):
        ModelRuntime.load(tmp_path / "nowhere")


def test_missing_manifest(model_copy: Path) -> None:
    (model_copy / "manifest.json").unlink()
    with pytest.raises(ModelFolderError, match=r"manifest.json is missing"):
        ModelRuntime.load(model_copy)


def test_missing_segment(model_copy: Path) -> None:
    (model_copy / "segment2.onnx").unlink()
    with pytest.raises(ModelFolderError, match=r"segment2.onnx is missing"):
        ModelRuntime.load(model_copy)


def test_truncated_segment(model_copy: Path) -> None:
    path = model_copy / "segment3.onnx"
    path.write_bytes(path.read_bytes()[:1000])
    with pytest.raises(ModelFolderError, match=r"segment3.onnx is corrupt.*SHA-256"):
        ModelRuntime.load(model_copy)


def test_corrupt_segment_with_matching_checksum(model_copy: Path) -> None:
    from models.manifest import sha256_file

    path = model_copy / "segment1.onnx"
    path.write_bytes(b"not an onnx file")
    _edit_manifest(model_copy, lambda d: d["exits"][0].update(sha256=sha256_file(path)))
    with pytest.raises(ModelFolderError, match=r"segment1.onnx: ONNX Runtime cannot load it"):
        ModelRuntime.load(model_copy)


def test_manifest_not_json(model_copy: Path) -> None:
    (model_copy / "manifest.json").write_text("{ not json")
    with pytest.raises(ModelFolderError, match=r"manifest.json is not valid JSON"):
        ModelRuntime.load(model_copy)


def test_manifest_with_unknown_key(model_copy: Path) -> None:
    _edit_manifest(model_copy, lambda d: d.update(colour="blue"))
    with pytest.raises(ModelFolderError, match=r"colour: Extra inputs are not permitted"):
        ModelRuntime.load(model_copy)


def test_manifest_class_count_mismatch(model_copy: Path) -> None:
    _edit_manifest(model_copy, lambda d: d["class_names"].pop())
    with pytest.raises(ModelFolderError, match=r"11 logits but there are 10 class names"):
        ModelRuntime.load(model_copy)


def test_manifest_shape_mismatch_with_the_onnx_file(model_copy: Path) -> None:
    def edit(d):  # type: ignore[no-untyped-def]
        d["exits"][0]["features"]["shape"][1] += 1
        d["exits"][1]["input"]["shape"][1] += 1

    _edit_manifest(model_copy, edit)
    with pytest.raises(ModelFolderError, match=r"segment1.onnx: outputs .* do not match the manifest"):
        ModelRuntime.load(model_copy)


def test_bench_model_prints_segment_and_preprocess_latency(tiny_model_folder: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    from edge_app.cli import main as edge_app_main

    assert edge_app_main(["bench-model", "--model", str(tiny_model_folder), "--frames", "20"]) == 0
    out = capsys.readouterr().out
    assert f"from {tiny_model_folder}" in out
    for row in ("pre-process 640x480", "segment 1 (-> exit 1)", "segment 3 (-> exit 3)",
                "full depth (all segments, one frame)"):
        line = next(ln for ln in out.splitlines() if ln.startswith(row))
        assert float(line[len(row):].split()[0]) > 0, line  # a median in ms
