"""Labelled, stamped test video from square images: for fake cameras, RTSP test servers and benchmarks.

Frame ``i`` of a ``LabelledVideo`` shows image ``i // hold`` scaled (nearest
neighbour, an integer factor when it can) to the frame height and centred,
so the model's centre crop sees the image again, and carries the stamp
``i`` in its left margin (``streams.stamp``).  ``label_of_stamp`` maps a
stamp back to the ground truth.

``LabelledVideoTrack`` plays one as an aiortc track (a WebRTC peer's camera in
tests and benchmarks).  ``write_y4m`` writes the YUV4MPEG2 file Chromium's
``--use-file-for-fake-video-capture`` plays (a header line, then
``FRAME`` + I420 planes: simple enough that no encoder library is needed).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import av
import cv2
import numpy as np
from aiortc import VideoStreamTrack

from streams.stamp import BITS, draw_stamp


@dataclass(frozen=True)
class LabelledVideo:
    images: np.ndarray  # (N, s, s, 3) uint8 RGB
    labels: np.ndarray  # (N,)
    hold: int = 10  # frames each image stays on screen
    width: int = 640
    height: int = 480

    def __post_init__(self) -> None:
        if self.images.ndim != 4 or self.images.shape[1] != self.images.shape[2] or self.images.shape[3] != 3:
            raise ValueError(f"images must be (N, s, s, 3), got {self.images.shape}")
        if len(self.images) * self.hold > 1 << BITS:
            raise ValueError(f"at most {1 << BITS} frames can be stamped")

    @property
    def num_frames(self) -> int:
        return len(self.images) * self.hold

    def frame(self, i: int) -> np.ndarray:
        img = self.images[(i // self.hold) % len(self.images)]
        side = self.height
        big = cv2.resize(img, (side, side), interpolation=cv2.INTER_NEAREST)
        out = np.full((self.height, self.width, 3), 32, np.uint8)
        x = (self.width - side) // 2
        out[:, x : x + side] = big
        draw_stamp(out, i)
        return out

    def frames(self) -> Iterator[np.ndarray]:
        for i in range(self.num_frames):
            yield self.frame(i)

    def label_of_stamp(self, stamp: int) -> int:
        return int(self.labels[(stamp // self.hold) % len(self.images)])


def write_y4m(path: Path, video: LabelledVideo, fps: int = 30) -> Path:
    with path.open("wb") as f:
        f.write(f"YUV4MPEG2 W{video.width} H{video.height} F{fps}:1 Ip A1:1 C420jpeg\n".encode())
        for rgb in video.frames():
            f.write(b"FRAME\n")
            f.write(cv2.cvtColor(rgb, cv2.COLOR_RGB2YUV_I420).tobytes())
    return path


def write_jpegs(folder: Path, video: LabelledVideo, quality: int = 92) -> Path:
    """``folder/00000.jpg`` ... (for GStreamer's ``multifilesrc``); returns the printf pattern."""
    folder.mkdir(parents=True, exist_ok=True)
    for i, rgb in enumerate(video.frames()):
        cv2.imwrite(str(folder / f"{i:05d}.jpg"), cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR),
                    [cv2.IMWRITE_JPEG_QUALITY, quality])
    return folder / "%05d.jpg"


class LabelledVideoTrack(VideoStreamTrack):
    """Plays a LabelledVideo in a loop at 30 fps on aiortc's 90 kHz clock; ``scale_down`` > 1 sends it smaller, as
    a browser does with ``scaleResolutionDownBy`` (the server's ``uplink`` requests)."""

    def __init__(self, video: LabelledVideo) -> None:
        super().__init__()
        self.video = video
        self.i = 0
        self.scale_down = 1.0

    async def recv(self) -> av.VideoFrame:
        pts, time_base = await self.next_timestamp()
        frame = av.VideoFrame.from_ndarray(self.video.frame(self.i % self.video.num_frames), format="rgb24")
        if self.scale_down > 1.0:
            frame = frame.reformat(width=int(frame.width / self.scale_down) & ~1,
                                   height=int(frame.height / self.scale_down) & ~1)
        frame.pts, frame.time_base = pts, time_base
        self.i += 1
        return frame
