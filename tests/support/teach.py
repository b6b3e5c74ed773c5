"""Helpers for the teaching tests: a JSON call, a training job followed until it ends, a model version."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path
from typing import Any

import aiohttp


async def call_json(http: aiohttp.ClientSession, method: str, url: str, body: Any = None) -> tuple[int, Any]:
    async with http.request(method, url, json=body) as r:
        return r.status, await r.json()


async def train_job(http: aiohttp.ClientSession, base: str, body: dict[str, Any], timeout_s: float = 600.0
                    ) -> dict[str, Any]:
    """Start a training job (202) and poll it until it is no longer running; returns its last status."""
    status, job = await call_json(http, "POST", f"{base}/api/training", body)
    assert status == 202, job
    for _ in range(int(timeout_s * 2)):
        _, job = await call_json(http, "GET", f"{base}/api/training/{job['id']}")
        if job["state"] != "running":
            break
        await asyncio.sleep(0.5)
    return dict(job)


def model_version(models_dir: Path, name: str, base: Path) -> Path:
    """A model version in ``models_dir``: ``base``'s segments with labels of its own (``NAME:label``), so a
    result's label says which model answered."""
    folder = models_dir / name
    shutil.copytree(base, folder)
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["class_names"] = [f"{name}:{c}" for c in manifest["class_names"]]
    manifest["name"] = name
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=2))
    return folder
