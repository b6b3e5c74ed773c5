"""Latest-frame slots, broadcast, reconnect backoff, frame stamps, annotation: plain values, no network."""

from __future__ import annotations

import asyncio

import cv2
import numpy as np
import pytest

from edge_app.annotate import Overlay, annotate
from edge_app.decision.budget import expected_frame_bytes, frame_budget, worst_network
from streams.frames import Broadcast, LatestSlot, SlotClosed
from streams.rtsp import Backoff
from streams.stamp import column_width, draw_stamp, read_stamp


async def test_slot_keeps_only_the_newest_and_counts_the_rest() -> None:
    slot: LatestSlot[int] = LatestSlot()
    drops: list[int] = []
    slot.on_drop = lambda: drops.append(1)
    for i in range(5):
        slot.put(i)
    assert await slot.get() == 4
    assert slot.dropped == 4 and len(drops) == 4 and slot.put_count == 5
    slot.put(5)
    assert await slot.get() == 5
    assert slot.dropped == 4  # a frame that was taken is not a drop


async def test_slot_get_waits_and_close_ends_it() -> None:
    slot: LatestSlot[int] = LatestSlot()
    waiter = asyncio.create_task(slot.get())
    await asyncio.sleep(0.01)
    assert not waiter.done()
    slot.put_threadsafe(7)
    assert await asyncio.wait_for(waiter, 1) == 7
    slot.close()
    with pytest.raises(SlotClosed):
        await slot.get()
    slot.put(8)  # after close: ignored
    assert slot.put_count == 1


def test_broadcast_isolates_a_failing_subscriber() -> None:
    b: Broadcast[int] = Broadcast()
    got: list[int] = []

    def broken(_: int) -> None:
        raise RuntimeError("boom")

    b.subscribe(broken)
    b.subscribe(got.append)
    b.publish(1)
    b.unsubscribe(broken)
    b.publish(2)
    assert got == [1, 2] and len(b) == 1


def test_backoff_doubles_and_is_capped() -> None:
    b = Backoff(0.5, 4.0)
    assert [b.delay_s(n) for n in range(1, 7)] == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]


@pytest.mark.parametrize(("h", "w"), [(480, 640), (240, 320), (720, 1280), (120, 160)])
def test_stamp_round_trips_at_any_size(h: int, w: int) -> None:
    rng = np.random.default_rng(h)
    for value in (0, 1, 12345, (1 << 14) - 1):
        img = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        draw_stamp(img, value)
        assert read_stamp(img) == value


def test_stamp_survives_blur_noise_and_jpeg() -> None:
    rng = np.random.default_rng(0)
    img = rng.integers(0, 256, (480, 640, 3), dtype=np.uint8)
    draw_stamp(img, 9876)
    img = cv2.GaussianBlur(img, (5, 5), 1.5)
    img = np.clip(img + rng.normal(0, 12, img.shape), 0, 255).astype(np.uint8)
    ok, jpg = cv2.imencode(".jpg", img, [cv2.IMWRITE_JPEG_QUALITY, 40])
    assert ok
    assert read_stamp(cv2.imdecode(jpg, cv2.IMREAD_COLOR)) == 9876


def test_no_stamp_in_an_ordinary_frame() -> None:
    rng = np.random.default_rng(1)
    assert read_stamp(rng.integers(0, 256, (480, 640, 3), dtype=np.uint8)) is None
    assert read_stamp(np.full((480, 640, 3), 128, np.uint8)) is None
    assert read_stamp(np.zeros((480, 640, 3), np.uint8)) is None  # no white start cell
    assert read_stamp(np.zeros((10, 10, 3), np.uint8)) is None  # too small to hold one


def test_annotation_leaves_the_stamp_column_alone() -> None:
    img = np.full((480, 640, 3), 200, np.uint8)
    draw_stamp(img, 321)
    before = img[:, : column_width(640)].copy()
    annotate(img, Overlay("7", 0.93, 2, 3, 12.0, 180.0, True))
    assert np.array_equal(img[:, : column_width(640)], before)
    assert read_stamp(img) == 321
    assert (img[:40, 100:300] != 200).any(), "the banner was drawn"


def test_frame_bytes_and_worst_viewer() -> None:
    assert expected_frame_bytes(1_200_000, 30) == pytest.approx(5000)
    assert expected_frame_bytes(1_200_000, 0) == pytest.approx(150_000)  # fps floor of 1
    # at the encoder's rate, sending one frame takes one frame interval
    b = frame_budget(250, 20, expected_frame_bytes(600_000, 30), 600_000, waited_ms=5)
    assert b.network_ms == pytest.approx(20 + 1000 / 30)
    assert b.compute_ms == pytest.approx(250 - 20 - 1000 / 30 - 5)
    assert worst_network([3.0, 40.0, 7.0]) == 1
    assert worst_network([]) is None
