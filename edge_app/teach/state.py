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
from models.errors import ModelError
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

    async def deploy(self, name: str, rollback: bool = False) -> dict[str, Any]:
        async with self._swap:
            folder = self.registry.validate(name)
            try:
                service = await self.hub.swap_model(folder)
            except (ModelError, OSError, ValueError) as exc:
                raise DatasetError(f"model {name!r} failed validation and was not swapped in: {exc}", 422) from exc
            if rollback:
                self.registry.rolled_back()
            else:
                self.registry.deployed(name)
            log.info("model %s %s", name, "restored (rollback)" if rollback else "deployed")
            return {"model": name, "classes": service.class_names, "folder": str(folder)}

    async def rollback(self) -> dict[str, Any]:
        return await self.deploy(self.registry.previous(), rollback=True)

    def status(self) -> dict[str, Any]:
        job = self.trainer.running
        return {"model_in_use": self.registry.active, "training": None if job is None else job.status()}


TEACH_KEY = web.AppKey("teach", Teach)
