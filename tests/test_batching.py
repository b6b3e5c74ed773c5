"""Batching across streams with per-frame exits: the segments take a batch, and a batch gives every frame what it
would get alone (the same exits run, the same answer), while frames of one batch stop at different exits."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from edge_app.config import PolicyConfig
from edge_app.decision.scheduler import policy_from_config
from models.runtime import ModelRuntime
from models.service import ChainRequest, InferenceService

DEFAULT_MODEL = Path(__file__).resolve().parents[1] / "models" / "default"


@pytest.fixture(scope="module")
def runtime() -> ModelRuntime:
    return ModelRuntime.load(DEFAULT_MODEL, threads=1, warmup=1)


def _requests(rt: ModelRuntime, images: np.ndarray, horizons: list[int]) -> list[ChainRequest]:
    policy = policy_from_config(PolicyConfig(), DEFAULT_MODEL)
    return [ChainRequest(rt.preprocess(img), policy, 1, h) for img, h in zip(images, horizons, strict=True)]


@pytest.mark.parametrize("n", [1, 2, 8, 32])
def test_segments_take_any_batch_and_match_single_frames(runtime: ModelRuntime, n: int,
                                                         demo_test_split: tuple[np.ndarray, np.ndarray]) -> None:
    assert runtime.batchable, "the shipped segments have a dynamic batch axis (python -m exporter batchify)"
    x = np.concatenate([runtime.preprocess(img) for img in demo_test_split[0][:n]])
    value = runtime.to_device(x)
    for k in range(runtime.num_exits):
        feats, probs, _ = runtime.run_segment(k, value)
        assert probs.shape == (n, len(runtime.class_names))
        for i in range(n):
            single = runtime.to_device(x[i : i + 1]) if k == 0 else None
            if single is not None:
                _, p1, _ = runtime.run_segment(0, single)
                np.testing.assert_allclose(probs[i], p1[0], atol=1e-5)
        if feats is not None:
            value = feats
    assert isinstance(value, ort.OrtValue)


def test_a_batch_gives_each_frame_its_own_exits_and_answers(runtime: ModelRuntime,
                                                            demo_test_split: tuple[np.ndarray, np.ndarray]) -> None:
    images = demo_test_split[0][:32]
    horizons = [3] * 24 + [1] * 4 + [2] * 4  # each frame keeps its own horizon (its deadline)
    service = InferenceService(runtime)
    reqs = _requests(runtime, images, horizons)
    single = [service.run_now(r) for r in reqs]
    batched = service.run_batch_now(reqs)
    for i, (a, b) in enumerate(zip(single, batched, strict=True)):
        assert not isinstance(b, Exception)
        assert len(a.results) == len(b.results) and a.choice == b.choice, i
        for ra, rb in zip(a.results, b.results, strict=True):
            np.testing.assert_allclose(ra.probs, rb.probs, atol=1e-5)
            assert ra.label == rb.label
    depths = [len(b.results) for b in batched if not isinstance(b, Exception)]
    assert max(depths[24:28]) == 1 and max(depths[28:]) <= 2, "a frame never runs past its horizon"
    assert len(set(depths[:24])) > 1, f"frames of one batch stop at different exits: {depths}"
    print(f"exits run per frame in one batch of 32: {np.bincount(depths, minlength=4)[1:].tolist()}")


async def test_the_service_gathers_concurrent_frames_into_batches(
        runtime: ModelRuntime, demo_test_split: tuple[np.ndarray, np.ndarray]) -> None:
    service = InferenceService(runtime, batch_window_ms=5.0, max_batch=8)
    assert service.batching
    service.start()
    try:
        reqs = _requests(runtime, demo_test_split[0][:16], [3] * 16)
        outs = await asyncio.gather(*(service.run(r) for r in reqs))
    finally:
        await service.stop()
    alone = [InferenceService(runtime).run_now(r) for r in reqs]
    assert [o.choice for o in outs] == [a.choice for a in alone]
    assert [len(o.results) for o in outs] == [len(a.results) for a in alone]
    assert service.batches == 2 and service.batched_frames == 16, (service.batches, service.batched_frames)
    assert service.predicted_costs_ms()[0] >= 5.0, "segment 1's predicted cost includes the window"


def test_batched_segments_keep_features_on_the_gpu(demo_test_split: tuple[np.ndarray, np.ndarray]) -> None:
    """On CUDA the batch's features stay on the device between segments (IOBinding); only the logits come back."""
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        pytest.skip("no CUDA provider here (the onnxruntime-gpu build and a GPU): the CPU path is tested above")
    rt = ModelRuntime.load(DEFAULT_MODEL, providers=["cuda"], warmup=1)
    x = np.concatenate([rt.preprocess(img) for img in demo_test_split[0][:8]])
    value = rt.to_device(x)
    feats, probs, _ = rt.run_segment(0, value)
    assert feats is not None and feats.device_name().lower() == "cuda" and probs.shape[0] == 8
    assert rt.take(feats, list(range(8))) is feats, "every frame goes on: no copy at all"
