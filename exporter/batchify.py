"""Give an exported model folder's segments a dynamic batch axis, in place (``python -m exporter batchify``).

Folders exported before segments were batchable take one frame per call. This rewrites each segment with
``make_batch_dynamic`` (the weights are untouched), updates the manifest's checksums, and checks that a batch of
one computes exactly what the old segment computed, and that a batch of N computes what N single calls compute.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import numpy as np

from exporter.errors import ExporterError
from exporter.onnx_export import cpu_sessions, make_batch_dynamic, run_chain
from models.manifest import read_manifest, sha256_file, write_manifest


def batchify(folder: Path, check_frames: int = 16) -> float:
    """Returns the largest difference seen (batch of N against N single calls, and against the old segments)."""
    manifest = read_manifest(folder)
    shape = manifest.exits[0].input.shape
    x = np.random.default_rng(0).standard_normal((check_frames, *shape[1:])).astype(np.float32)
    with tempfile.TemporaryDirectory() as tmp:
        old_paths = []
        for ex in manifest.exits:
            old = Path(tmp) / ex.file
            shutil.copyfile(folder / ex.file, old)
            old_paths.append(old)
        before = [run_chain(cpu_sessions(old_paths, 1), x[i : i + 1]) for i in range(check_frames)]
        exits = []
        for ex in manifest.exits:
            if not make_batch_dynamic(folder / ex.file):
                raise ExporterError(f"{folder / ex.file}: cannot give it a dynamic batch axis")
            exits.append(ex.model_copy(update={"sha256": sha256_file(folder / ex.file)}))
        write_manifest(folder, manifest.model_copy(update={"exits": exits}))
    sessions = cpu_sessions([folder / ex.file for ex in manifest.exits], 1)
    batched = run_chain(sessions, x)
    worst = 0.0
    for i in range(check_frames):
        single = run_chain(sessions, x[i : i + 1])
        for k, outs in enumerate(single):
            for j, out in enumerate(outs):
                worst = max(worst, float(np.abs(out - before[i][k][j]).max()),
                            float(np.abs(out[0] - batched[k][j][i]).max()))
    if worst > 1e-4:
        raise ExporterError(f"{folder}: the batched segments differ from the old ones by {worst:.3g}")
    return worst
