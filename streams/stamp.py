"""A frame counter drawn into the left margin of a frame, readable after lossy video coding.

Probe clients and generated test videos ``draw_stamp`` a number into a
column of black/white cells at the left edge (outside the centre square the
model looks at); the server ``read_stamp``s it back to tie each result to
the exact source frame (for accuracy against known labels and for
glass-to-glass latency).  The column holds a white start cell, ``BITS``
data cells (most significant first) and a black end cell; a frame whose
cells are not clearly black or white has no stamp (``None``).
"""

from __future__ import annotations

import numpy as np

BITS = 14  # 16384 distinct frames: over 9 minutes at 30 fps before it wraps
CELLS = BITS + 2
_FRACTION_OF_WIDTH = 1 / 12  # stamp column width; the 4:3 margin outside the centre square is 1/8


def column_width(w: int) -> int:
    """Width of the stamp column of a frame ``w`` pixels wide (drawings should leave it alone)."""
    return max(4, int(w * _FRACTION_OF_WIDTH))


def _cells(h: int, w: int) -> tuple[int, int, list[tuple[int, int]]]:
    cw = column_width(w)
    ch = h // CELLS
    return cw, ch, [(i * ch, (i + 1) * ch) for i in range(CELLS)]


def draw_stamp(rgb: np.ndarray, value: int) -> None:
    """Draw ``value`` (mod 2**BITS) into ``rgb`` (H, W, 3 uint8) in place."""
    h, w = rgb.shape[:2]
    cw, _, rows = _cells(h, w)
    v = value % (1 << BITS)
    bits = [1] + [(v >> (BITS - 1 - i)) & 1 for i in range(BITS)] + [0]
    for (y0, y1), b in zip(rows, bits, strict=True):
        rgb[y0:y1, :cw] = 255 if b else 0


def read_stamp(rgb: np.ndarray) -> int | None:
    """The stamped value, or None when the margin holds no clean stamp."""
    h, w = rgb.shape[:2]
    if h < CELLS * 4 or w < 32:
        return None
    cw, ch, rows = _cells(h, w)
    my, mx = ch // 4, cw // 4  # read the middle of each cell, away from coding artefacts at the edges
    levels = [float(rgb[y0 + my : y1 - my, mx : cw - mx].mean()) for y0, y1 in rows]
    if any(85 < v < 170 for v in levels) or levels[0] < 128 or levels[-1] >= 128:
        return None
    value = 0
    for v in levels[1:-1]:
        value = (value << 1) | (v >= 128)
    return value
