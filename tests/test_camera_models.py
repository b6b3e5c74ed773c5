"""Every camera its own model: three file cameras, the box's default model and two other versions, each camera
answered by its own (each model loaded once, unloaded when nothing uses it); a deploy on one camera changes nothing
for the others (their pipelines keep their engine and their decider: same frames in, same answers out); a camera's
roll back returns it to what the config says; a model no camera names is refused at start, naming the camera."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
import numpy as np
import pytest
from support.clips import write_clip
from support.live import serving
from support.teach import call_json, model_version

from edge_app.appkeys import HUB_KEY
from edge_app.config import AppConfig, ConfigError
from edge_app.hub import Hub
from edge_app.results import AnalysedFrame

REPO = Path(__file__).resolve().parents[1]
DEFAULT_MODEL = REPO / "models" / "default"
pytestmark = [pytest.mark.slow, pytest.mark.live]


@asynccontextmanager
async def _app(cfg: AppConfig) -> AsyncIterator[tuple[str, Hub]]:
    async with serving(cfg) as (base, app):
        yield base, app[HUB_KEY]


async def test_each_camera_is_answered_by_its_own_model_and_a_deploy_on_one_leaves_the_others_alone(
        app_config: Callable[..., AppConfig], demo_test_split: tuple[np.ndarray, np.ndarray], tmp_path: Path) -> None:
    models_dir = tmp_path / "models"
    for name in ("garage-1", "porch-1", "porch-2"):
        model_version(models_dir, name, DEFAULT_MODEL)
    clip = write_clip(tmp_path / "clip.mp4", demo_test_split[0][:30])
    cameras = [{"name": "shelf", "kind": "file", "path": str(clip)},
               {"name": "garage", "kind": "file", "path": str(clip), "model": "garage-1"},
               {"name": "porch", "kind": "file", "path": str(clip), "model": "porch-1"}]
    cfg = app_config(cameras=cameras, training={"models_dir": str(models_dir), "data_dir": str(tmp_path / "data")})
    seen: dict[str, list[str]] = {c["name"]: [] for c in cameras}

    def collect(camera: str) -> Callable[[AnalysedFrame], None]:
        return lambda af: seen[camera].append(af.classes[af.result.raw_class])

    async with _app(cfg) as (base, hub), aiohttp.ClientSession() as http:
        for name in seen:
            hub.registry.camera(name).subscribe(collect(name), video=False)
        await asyncio.sleep(3.0)
        _, status = await call_json(http, "GET", base + "/status")
        by_camera = {c["name"]: c["model"] for c in status["cameras"]}
        loaded = {m["name"]: m["users"] for m in status["models"]}
        assert by_camera == {"shelf": {"name": "default", "own": False, "model": status["model"]["name"]},
                             "garage": {"name": "garage-1", "own": True, "model": "garage-1"},
                             "porch": {"name": "porch-1", "own": True, "model": "porch-1"}}, by_camera
        assert loaded == {"default": ["camera:shelf"], "garage-1": ["camera:garage"], "porch-1": ["camera:porch"]}
        for name, prefix in (("garage", "garage-1:"), ("porch", "porch-1:")):
            assert seen[name] and all(label.startswith(prefix) for label in seen[name]), (name, seen[name][:5])
        assert seen["shelf"] and not any(":" in label for label in seen["shelf"])

        # a deploy on the porch: the shelf's and the garage's pipelines keep their engine and decider
        before = {n: (hub.registry.camera(n).engine, hub.registry.camera(n).decider,
                      hub.registry.camera(n).tally.analysed) for n in ("shelf", "garage")}
        code, body = await call_json(http, "POST", base + "/api/models/porch-2/deploy", {"camera": "porch"})
        assert code == 200 and body["camera"] == "porch" and body["model"] == "porch-2", body
        n_porch = len(seen["porch"])
        await asyncio.sleep(2.0)
        for n, (engine, decider, analysed) in before.items():
            pipe = hub.registry.camera(n)
            assert pipe.engine is engine and pipe.decider is decider, f"{n}: its pipeline was touched"
            assert pipe.tally.analysed > analysed, f"{n}: kept answering through the deploy"
        assert all(label.startswith("porch-2:") for label in seen["porch"][n_porch + 2:])
        _, status = await call_json(http, "GET", base + "/status")
        loaded = {m["name"]: m["users"] for m in status["models"]}
        assert "porch-1" not in loaded and loaded["porch-2"] == ["camera:porch"], "the unused model was unloaded"
        _, models = await call_json(http, "GET", base + "/api/models")
        assert models["cameras"]["porch"]["model"] == "porch-2" and models["in_use"] == "default"

        # the camera's roll back: back to porch-1 (its config); a second one has nothing before it
        code, body = await call_json(http, "POST", base + "/api/models/rollback", {"camera": "porch"})
        assert code == 200 and body["model"] == "porch-1", body
        code, body = await call_json(http, "POST", base + "/api/models/rollback", {"camera": "porch"})
        assert code == 409, body
        code, body = await call_json(http, "POST", base + "/api/models/porch-2/deploy", {"camera": "attic"})
        assert code == 404 and "attic" in body["error"], body

        # the box's default moves the shelf (no model of its own) and nothing else
        garage = hub.registry.camera("garage").engine
        code, body = await call_json(http, "POST", base + "/api/models/porch-2/deploy")
        assert code == 200 and body["camera"] is None
        assert hub.registry.camera("garage").engine is garage
        assert hub.placement.camera_models == {"shelf": "porch-2", "garage": "garage-1", "porch": "porch-1"}
        assert set(hub.models.models) == {"porch-2", "garage-1", "porch-1"}, "the old default was unloaded"

    # a restart serves what was deployed: the default and each camera's own
    async with _app(cfg) as (base, hub):
        assert hub.placement.camera_models == {"shelf": "porch-2", "garage": "garage-1", "porch": "porch-1"}

    bad = app_config(cameras=[{**cameras[1], "model": "attic-9"}],
                     training={"models_dir": str(models_dir), "data_dir": str(tmp_path / "data")})
    with pytest.raises(ConfigError, match=r"garage.*attic-9"):
        async with _app(bad):
            pass
