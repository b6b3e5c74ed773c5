"""Short H.264 clips for file cameras (PyAV, libx264)."""

from __future__ import annotations

from pathlib import Path

import av
import numpy as np

FPS = 15


def write_clip(path: Path, images: np.ndarray, seconds: float = 2.0) -> Path:
    """An H.264 MP4 of ``images`` (upscaled to 320x240), ``seconds`` long at 15 fps."""
    with av.open(str(path), "w") as out:
        stream = out.add_stream("libx264", rate=FPS)
        stream.width, stream.height, stream.pix_fmt = 320, 240, "yuv420p"
        stream.options = {"bf": "0", "g": str(FPS)}
        for i in range(int(seconds * FPS)):
            img = np.ascontiguousarray(np.resize(images[i % len(images)], (240, 320, 3)))
            frame = av.VideoFrame.from_ndarray(img, format="rgb24")
            out.mux(stream.encode(frame))
        out.mux(stream.encode(None))
    return path
