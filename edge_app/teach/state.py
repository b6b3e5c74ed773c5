"""The capture, training and deployment state of one app (the teach API's ``Teach``), found through the hub's
pipeline registry, never by reaching into sessions."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from aiohttp import web

from edge_app.config import AppConfig
from edge_app.hub import Hub
from edge_app.pipeline import AnalysisPipeline
from edge_app.registry import UnknownSource
from edge_app.teach.capture import Recorder
from edge_app.teach.frames import DatasetError
from edge_app.teach.jobs import Trainer
from edge_app.teach.shadow import Shadows
from edge_app.teach.store import DatasetStore
from models.errors import ModelError, RegistryError
from models.registry import ModelRegistry

log = logging.getLogger(__name__)


class Teach:
    """The capture, training and deployment state of one app."""

    def __init__(self, config: AppConfig, hub: Hub) -> None:
        t = config.training
        self.hub = hub
        self.store = DatasetStore(config.resolve(t.data_dir), t.block_s)
        self.registry = ModelRegistry(config.resolve(t.models_dir), config.model_path)
        self.recorder = Recorder(self.store, self.pipeline_for, t.max_record_s)
        self.trainer = Trainer(self.store, t, config.resolve(t.models_dir))
        self.shadows = Shadows()
        self._swap = asyncio.Lock()

    def pipeline_for(self, source: str) -> AnalysisPipeline:
        try:
            return self.hub.registry.get(source)
        except UnknownSource:
            cameras = sorted(e.name for e in self.hub.registry.entries("camera"))
            raise DatasetError(f"no source {source!r}: use camera:NAME (one of {cameras}) or session:ID of an open "
                               "session that sends its camera (GET /api/sources)", 404) from None

    def sources(self) -> list[dict[str, Any]]:
        return [{"id": e.id, "kind": e.kind, "name": e.name} for e in self.hub.registry.entries()]

    async def deploy(self, name: str, camera: str | None = None, rollback: bool = False, record: bool = True
                     ) -> dict[str, Any]:
        """Serve ``name`` on ``camera`` only, or as the box's default (``camera`` None); ``record``: write it in
        the registry's history (another process that already did says False)."""
        async with self._swap:
            folder = self.registry.validate(name)
            try:
                model = await self.hub.deploy(name, camera)
            except (ModelError, OSError, ValueError) as exc:
                if isinstance(exc, RegistryError):
                    raise
                raise DatasetError(f"model {name!r} failed validation and was not swapped in: {exc}", 422) from exc
            if not record:
                pass
            elif rollback:
                self.registry.rolled_back(camera)
            else:
                self.registry.deployed(name, camera)
            where = "" if camera is None else f" on camera {camera}"
            log.info("model %s %s%s", name, "restored (rollback)" if rollback else "deployed", where)
            return {"model": name, "camera": camera, "classes": model.class_names, "folder": str(folder)}

    async def rollback(self, camera: str | None = None) -> dict[str, Any]:
        previous = self.registry.previous(camera)
        if previous is not None:
            return await self.deploy(previous, camera, rollback=True)
        assert camera is not None  # a camera's first deployment rolled back: it serves what the config says again
        async with self._swap:
            model = await self.hub.as_configured(camera)
            self.registry.rolled_back(camera)
            log.info("camera %s: back to the model its config names (%s)", camera, model.name)
            return {"model": model.name, "camera": camera, "classes": model.class_names, "folder": str(model.folder)}

    def models(self) -> dict[str, Any]:
        """Every version; the box's default and its history; each camera's model and its own history."""
        placement = self.hub.placement
        return {"in_use": self.registry.active, "history": self.registry.history(),
                "models": self.registry.versions(),
                "cameras": {c: {**placement.status(c), "history": self.registry.history(c)}
                            for c in placement.camera_models}}

    def status(self) -> dict[str, Any]:
        job = self.trainer.running
        return {"model_in_use": self.registry.active, "training": None if job is None else job.status()}


TEACH_KEY = web.AppKey("teach", Teach)
