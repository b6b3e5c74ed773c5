"""The send-rate decisions, synchronously: annotated video follows the path's reports; the uplink request follows
how late the browser's frames arrive."""

from __future__ import annotations

from streams.ratecontrol import UplinkController, VideoRateController


def test_video_rate_cuts_at_once_on_loss_or_a_queue_and_rises_slowly() -> None:
    c = VideoRateController(start_bps=500_000, min_bps=60_000)
    assert c.update(0.0, 0.0, 30.0, 30.0).target_bps == 500_000, "a clean path keeps the target"
    assert c.update(1.0, 0.05, 30.0, 30.0).target_bps == 350_000, "5 % loss: cut 30 % at once"
    assert c.update(1.2, 0.05, 30.0, 30.0).target_bps == 350_000, "one cut per 0.5 s: a burst of reports is one cut"
    assert c.update(1.6, 0.0, 120.0, 30.0).target_bps == 245_000, "RTT 90 ms over its floor: a queue, cut again"
    for t in range(2, 12):
        rate = c.update(1.6 + t, 0.0, 31.0, 30.0)
    assert 245_000 < rate.target_bps < 245_000 * 1.08 ** 11 * 1.01, "raised slowly (8 % a second) once clean"
    assert c.update(20.0, 0.0, 31.0, 30.0, remb_bps=200_000).target_bps == 200_000, "the peer's REMB is a ceiling"
    for t in range(40):
        rate = c.update(21.0 + t, 0.3, 300.0, 30.0)
    assert rate.target_bps == 60_000 and rate.max_fps == 10.0, "never under the floor; fewer frames when narrow"
    assert VideoRateController(start_bps=200_000).rate.max_fps == 15.0


def test_uplink_request_steps_down_when_frames_queue_and_back_when_calm() -> None:
    u = UplinkController()
    assert u.update(0.0, 80.0) is None, "one late frame is not a queue"
    assert u.update(0.5, 90.0) is None
    first = u.update(1.0, 95.0)
    assert first is not None and first.max_bitrate_bps == 600_000 and u.level == 1
    assert u.update(1.5, 95.0) is None, "a step, then another sustained second before the next"
    second = u.update(2.6, 95.0)
    assert second is not None and second.scale_down == 2.0 and second.message()["type"] == "uplink"
    assert u.update(3.0, 10.0) is None and u.update(7.0, 10.0) is None, "calm for less than 5 s: no change"
    back = u.update(8.1, 10.0)
    assert back is not None and u.level == 1 and back.max_bitrate_bps == 600_000
