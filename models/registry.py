"""Model versions taught from the page, and which one is in use.

    MODELS_DIR/VERSION/                 a model folder (segments, manifest, traces, policy.json)
    MODELS_DIR/deployments.json         {"history": [{"model": NAME, "at": UNIX_S}, ...],
                                         "cameras": {CAMERA: [{"model": NAME, "at": UNIX_S}, ...]}}

``default`` is the configured ``[model] path``. ``history``'s last entry is the box's default model: what every
camera without a model of its own (``[[cameras]] model``, or one deployed on it) and every browser session uses.
A camera's own history overrides its config: deploying on a camera appends to it, rolling back drops its last
entry (the first one rolled back, the camera serves what the config says). A folder is checked before anything is
swapped (``validate``); the hub then loads it, and a folder that does not load is never served.
"""

from __future__ import annotations

import json
import re
import shutil
import time
from pathlib import Path
from typing import Any

from models.errors import ModelError, RegistryError
from models.manifest import read_manifest

DEFAULT = "default"
REPORT_FILE = "report.json"
FILES = ("manifest.json", "policy.json")


class ModelRegistry:
    def __init__(self, models_dir: Path, default_folder: Path) -> None:
        self.dir = models_dir
        self.default_folder = default_folder

    @property
    def _file(self) -> Path:
        return self.dir / "deployments.json"

    def _read(self) -> dict[str, Any]:
        if not self._file.is_file():
            return {}
        try:
            data = json.loads(self._file.read_text())
        except (OSError, ValueError) as exc:
            raise RegistryError(f"{self._file} cannot be read ({exc}); fix or remove it (the box then serves the "
                                "configured models)", 500) from exc
        return data if isinstance(data, dict) else {}

    def history(self, camera: str | None = None) -> list[dict[str, Any]]:
        """The box's deployments (``camera`` None: the box's default model, which every camera without a model of
        its own and every browser session uses), or one camera's (empty: the camera serves what the config says)."""
        data = self._read()
        if camera is not None:
            return list((data.get("cameras") or {}).get(camera) or [])
        hist = data.get("history") or []
        return hist if hist else [{"model": DEFAULT, "at": None}]

    def _write(self, history: list[dict[str, Any]], camera: str | None = None) -> None:
        data = self._read()
        if camera is None:
            data["history"] = history
        else:
            cameras = data.setdefault("cameras", {})
            if history:
                cameras[camera] = history
            else:
                cameras.pop(camera, None)
        self.dir.mkdir(parents=True, exist_ok=True)
        tmp = self._file.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=1))
        tmp.replace(self._file)

    @property
    def active(self) -> str:
        """The box's default model."""
        return str(self.history()[-1]["model"])

    def deployed_on(self, camera: str) -> str | None:
        """The model last deployed on ``camera`` from the page; None: the camera serves what the config says."""
        hist = self.history(camera)
        return str(hist[-1]["model"]) if hist else None

    def cameras(self) -> dict[str, str]:
        """Every camera with a model deployed on it: its model."""
        return {c: str(h[-1]["model"]) for c, h in (self._read().get("cameras") or {}).items() if h}

    def folder(self, name: str) -> Path:
        if name == DEFAULT:
            return self.default_folder
        folder = self.dir / _check_name(name)
        if not folder.is_dir():
            raise RegistryError(f"no model {name!r}; models: {[v['name'] for v in self.versions()]}", 404)
        return folder

    def validate(self, name: str) -> Path:
        """The folder of ``name`` if it is a complete model folder; ``DatasetError`` (422) naming what is wrong."""
        folder = self.folder(name)
        missing = [f for f in FILES if not (folder / f).is_file()]
        if missing:
            raise RegistryError(f"model {name!r} ({folder}) is incomplete: no {', '.join(missing)}", 422)
        try:
            manifest = read_manifest(folder)
        except (ModelError, OSError, ValueError) as exc:
            raise RegistryError(f"model {name!r}: {exc}", 422) from exc
        absent = [e.file for e in manifest.exits if not (folder / e.file).is_file()]
        if absent:
            raise RegistryError(f"model {name!r} ({folder}) lacks its segments {absent}", 422)
        return folder

    def deployed(self, name: str, camera: str | None = None) -> None:
        self._write([*self.history(camera), {"model": name, "at": round(time.time(), 1)}][-50:], camera)

    def previous(self, camera: str | None = None) -> str | None:
        """What a roll back serves: the model deployed before (``camera``: None when its first deployment is rolled
        back, the camera then serves what the config says)."""
        hist = self.history(camera)
        if camera is not None and len(hist) == 1:
            return None
        if len(hist) < 2:
            where = "" if camera is None else f" on camera {camera!r}"
            raise RegistryError(f"nothing to roll back to: no model was deployed{where} before this one", 409)
        return str(hist[-2]["model"])

    def rolled_back(self, camera: str | None = None) -> None:
        self._write(self.history(camera)[:-1], camera)

    def versions(self) -> list[dict[str, Any]]:
        """Every model, newest first: name, classes, per-exit held-out accuracy and cost, in use or not."""
        names = [DEFAULT]
        if self.dir.is_dir():
            names += sorted((p.name for p in self.dir.iterdir() if (p / "manifest.json").is_file()), reverse=True)
        active = self.active
        out = []
        for name in names:
            folder = self.default_folder if name == DEFAULT else self.dir / name
            try:
                m = read_manifest(folder)
            except (ModelError, OSError, ValueError) as exc:
                out.append({"name": name, "error": str(exc), "in_use": name == active})
                continue
            out.append({"name": name, "folder": str(folder), "classes": m.class_names,
                        "input_size": m.input.width, "width": m.architecture.get("width"),
                        "test_accuracy": [round(e.test_accuracy, 4) for e in m.exits],
                        "costs_ms": [round(c, 3) for c in m.costs_ms], "in_use": name == active,
                        "policy": (folder / "policy.json").is_file(), "report": self.report(folder)})
        return out

    @staticmethod
    def report(folder: Path) -> dict[str, Any] | None:
        """What training found (``exporter.teach``'s report.json: check accuracy and confusion, the frames it got
        wrong, the policy and its operating points); None for a model not taught here."""
        path = folder / REPORT_FILE
        if not path.is_file():
            return None
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) else None

    def latest_for(self, dataset: str, classes: list[str]) -> str | None:
        """The newest model taught on ``dataset`` with exactly ``classes`` (a retraining starts from it)."""
        prefix = dataset.replace(" ", "_") + "-"
        for v in self.versions():
            if v["name"].startswith(prefix) and v.get("classes") == classes and v.get("policy"):
                return str(v["name"])
        return None

    def delete(self, name: str) -> None:
        used = {h["model"] for h in self.history()} | {h["model"] for c in self.cameras() for h in self.history(c)}
        if name == DEFAULT or name in used:
            raise RegistryError(f"model {name!r} is in use or in the deployment history (roll back first)", 409)
        shutil.rmtree(self.folder(name))


NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9 _.-]{0,63}$")


def _check_name(name: object) -> str:
    if not isinstance(name, str) or not NAME.match(name) or name in (".", ".."):
        raise RegistryError(f"model name {name!r}: use 1-64 letters, digits, spaces, '_', '-' or '.', starting with "
                            "a letter or digit")
    return name
