"""Which model answers each camera, and moving a camera, or the box's default, to another model.

A camera is answered by the model deployed on it from the page (``models.registry``: its own history), else by its
``[[cameras]] model``, else by the box's default, which every camera without a model of its own and every browser
session follows. ``deploy`` loads the model once (``edge_app.served.ModelSet``), switches only the pipelines that
move (each between two frames: ``AnalysisPipeline.use``), tells their viewers through ``moved``, and unloads a
model nothing uses any more.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from edge_app.config import AppConfig, ConfigError
from edge_app.registry import PipelineRegistry
from edge_app.served import ModelSet, ServedModel
from models.errors import ModelError, RegistryError
from models.registry import DEFAULT, ModelRegistry

log = logging.getLogger(__name__)

Moved = Callable[[list[str], bool, ServedModel], None]  # (cameras moved, browser sessions moved, their new model)


def registry_name(registry: ModelRegistry, folder: Path) -> str:
    """The registry's name of the model in ``folder`` (``default``: ``[model] path``)."""
    active = registry.active
    with contextlib.suppress(RegistryError):
        if active != DEFAULT and registry.folder(active).resolve() == folder.resolve():
            return active
    return DEFAULT


class Placement:
    def __init__(self, config: AppConfig, models: ModelSet, registry: ModelRegistry, pipelines: PipelineRegistry
                 ) -> None:
        self.models, self.registry, self.pipelines = models, registry, pipelines
        self.camera_models: dict[str, str] = {}  # camera: the model answering it
        self.own: dict[str, bool] = {}  # camera: it has a model of its own (its config, or deployed on it)
        self.configured = {c.name: c.model for c in config.cameras}  # [[cameras]] model

    def of(self, camera: str) -> ServedModel:
        return self.models[self.camera_models[camera]]

    def manifest_name(self, camera: str) -> str:
        """The model's own name (its manifest's) answering ``camera`` (the box's default for any other source)."""
        model = self.of(camera) if camera in self.camera_models else self.models[self.models.default]
        return model.service.backend.manifest.name

    async def place(self, camera: str) -> ServedModel:
        """The model for ``camera`` at start, loaded; ``ConfigError`` naming the camera when it cannot be served."""
        deployed = self.registry.deployed_on(camera)
        configured = self.configured.get(camera)
        name = deployed or configured or self.models.default
        try:
            model = await self.models.acquire(name, f"camera:{camera}")
        except (RegistryError, ModelError) as exc:
            raise ConfigError(f"[[cameras]] {camera!r}: model {name!r} cannot be served ({exc}); models: "
                              f"{[v['name'] for v in self.registry.versions()]}") from exc
        self.camera_models[camera], self.own[camera] = name, bool(deployed or configured)
        return model

    async def deploy(self, name: str, camera: str | None, moved: Moved) -> ServedModel:
        """Serve ``name`` on ``camera`` only (every other pipeline untouched: same frames in, same answers out), or
        as the box's default (``camera`` None). ``RegistryError`` / ``ModelError`` when it does not load, and
        nothing changes."""
        if camera is not None and camera not in self.camera_models:
            raise RegistryError(f"no camera named {camera!r}; configured cameras: {sorted(self.camera_models)}", 404)
        cameras = [camera] if camera is not None else [c for c in self.camera_models if not self.own[c]]
        sessions = [] if camera is not None else [e.id for e in self.pipelines.entries("browser")]
        model = await self.models.acquire(name, f"deploy:{name}")
        try:
            olds = {c: self.camera_models[c] for c in cameras}
            old_default = self.models.default
            if camera is None:
                self.models.default = name
            else:
                self.own[camera] = True
            for c in cameras:
                self.camera_models[c] = name
                model.users.add(f"camera:{c}")
            model.users.update(sessions)
            await asyncio.gather(*(self.pipelines.get(f"camera:{c}").use(model.engine) for c in cameras),
                                 *(self.pipelines.get(sid).use(model.engine) for sid in sessions))
            moved(cameras, camera is None, model)
            for c, old in olds.items():
                if old != name:
                    await self.models.release(old, f"camera:{c}")
            if camera is None and old_default != name:
                for sid in sessions:
                    await self.models.release(old_default, sid)
                await self.models.release(old_default, "")  # the old default, if nothing uses it now
        finally:
            model.users.discard(f"deploy:{name}")
        log.info("model: %s now answers %s (%s, %d classes), policy %s", name,
                 f"camera {camera}" if camera is not None else "as the box's default", model.folder,
                 len(model.class_names), model.policy.name)
        return model

    async def as_configured(self, camera: str, moved: Moved) -> ServedModel:
        """``camera`` serves what its config says again (the model deployed on it rolled back): its ``[[cameras]]
        model``, else the box's default."""
        configured = self.configured.get(camera)
        model = await self.deploy(configured or self.models.default, camera, moved)
        self.own[camera] = configured is not None
        return model

    def status(self, camera: str) -> dict[str, Any]:
        return {"name": self.camera_models[camera], "own": self.own[camera], "model": self.manifest_name(camera)}
