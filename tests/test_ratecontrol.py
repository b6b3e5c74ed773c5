"""The send-rate decisions, synchronously: annotated video follows the path's reports; the uplink request follows
how late the browser's frames arrive."""

from __future__ import annotations

from streams.ratecontrol import VideoRateController
from streams.uplink import UplinkController


def test_video_rate_cuts_at_once_on_loss_or_a_queue_and_rises_slowly() -> None:
    c = VideoRateController(start_bps=500_000, min_bps=60_000)
    assert c.update(0.0, 0.0, 30.0, 30.0).target_bps == 500_000, "a clean path keeps the target"
    assert c.update(1.0, 0.05, 30.0, 30.0).target_bps == 350_000, "5 % loss: cut 30 % at once"
    assert c.update(1.2, 0.05, 30.0, 30.0).target_bps == 350_000, "one cut per 0.5 s: a burst of reports is one cut"
    assert c.update(1.5, 0.0, 120.0, 30.0).target_bps == 350_000, "one late RTT may be our own loop: no cut yet"
    assert c.update(1.6, 0.0, 120.0, 30.0).target_bps == 245_000, "RTT 90 ms over its floor twice: a queue, cut"
    for t in range(2, 12):
        rate = c.update(1.6 + t, 0.0, 31.0, 30.0)
    assert 245_000 < rate.target_bps < 245_000 * 1.08 ** 11 * 1.01, "raised slowly (8 % a second) once clean"
    before = c.target_bps
    assert c.update(20.0, 0.0, 31.0, 30.0, remb_bps=200_000, sent_bps=150_000).target_bps >= before, \
        "a REMB over what arrives is the browser's estimate growing with what we send, not congestion"
    assert c.update(20.3, 0.0, 31.0, 30.0, remb_bps=200_000, sent_bps=300_000).target_bps >= before, \
        "a REMB under what we send on a path with no queue: a browser's start-up estimate, not congestion"
    c.update(20.4, 0.0, 75.0, 30.0, remb_bps=200_000, sent_bps=300_000)
    assert c.update(20.5, 0.0, 75.0, 30.0, remb_bps=200_000, sent_bps=300_000).target_bps == 140_000, \
        "a REMB under what we send and a queue twice in a row: overuse, 70 % of the REMB is the ceiling"
    for t in range(40):
        rate = c.update(21.0 + t, 0.3, 300.0, 30.0)
    assert c.target_bps == 60_000, "never under the floor"
    assert rate.target_bps == 20_000 and rate.max_fps == 1.0, "at the floor and still congested: a frame a second"
    assert VideoRateController(start_bps=200_000).rate.max_fps == 15.0
    c = VideoRateController(start_bps=800_000)
    c.update(0.0, 0.0, 400.0, 30.0)
    assert c.update(0.1, 0.0, 400.0, 30.0).target_bps == 400_000, "a long queue already: halved at once"


def test_video_rate_waits_while_a_queue_drains_and_sends_smaller_frames_when_narrow() -> None:
    c = VideoRateController(start_bps=1_000_000)
    assert c.rate.scale_down == 1.0
    c.update(-0.1, 0.0, 400.0, 30.0)
    assert c.update(0.0, 0.0, 400.0, 30.0).target_bps == 500_000, "a long queue: halved"
    assert c.update(0.6, 0.0, 300.0, 30.0).target_bps == 500_000, "the queue drains (RTT falls): wait, no cut"
    assert c.update(1.2, 0.0, 390.0, 30.0).target_bps == 250_000, "it stopped draining: cut again"
    assert c.rate.scale_down == 2.0 and c.rate.max_fps == 15.0, "under 300 kbit/s: half the size, half the rate"
    assert c.update(1.8, 0.05, 100.0, 30.0).target_bps == 175_000, "loss cuts even while the queue drains"
    c.update(8.9, 0.0, 900.0, 30.0)
    assert c.update(9.0, 0.0, 900.0, 30.0).target_bps == 87_500, "long after the last cut, a new queue is cut"
    for t in range(10, 40):
        rate = c.update(float(t), 0.0, 30.0, 30.0)
    assert rate.target_bps > 450_000 and rate.scale_down == 1.0, "full size again once the target recovers"
    c = VideoRateController(start_bps=500_000)
    c.update(0.0, 0.0, 75.0, 30.0, remb_bps=400_000, sent_bps=500_000)
    c.update(0.1, 0.0, 75.0, 30.0, remb_bps=400_000, sent_bps=500_000)  # a queue twice: cut, and the REMB caps
    assert c.rate.target_bps == 280_000 and c.rate.scale_down == 2.0
    c.update(6.0, 0.0, 30.0, 30.0, remb_bps=600_000, sent_bps=280_000)
    assert c.rate.scale_down == 2.0, "between 300 and 450 kbit/s the size stays as it was"


def test_video_rate_ignores_probes_that_queued_before_its_cut_and_fits_the_picture() -> None:
    c = VideoRateController(start_bps=1_000_000)
    assert c.update(-0.3, 0.0, 400.0, 30.0, probe_sent_s=-0.6).target_bps == 1_000_000, \
        "one late ping may be the server's own loop running late: no cut yet"
    assert c.update(0.0, 0.0, 400.0, 30.0, probe_sent_s=-0.4).target_bps == 500_000, "two in a row: a queue"
    assert c.update(0.3, 0.0, 600.0, 30.0, probe_sent_s=0.1).target_bps == 500_000, \
        "a ping sent just after the cut waits behind the old queue: no second cut for it"
    assert c.update(0.9, 0.0, 600.0, 30.0, probe_sent_s=0.5).target_bps == 250_000, \
        "a ping sent after the hold (the cut's RTT) that still queues: cut again"
    c = VideoRateController(start_bps=1_000_000)
    for t in range(10):  # a loop stall now and then: never two late pings in a row
        c.update(t * 0.5, 0.0, 300.0 if t % 2 else 3.0, 2.0, probe_sent_s=t * 0.5 - 0.3)
    assert c.rate.target_bps >= 1_000_000, "never cut (and raised, the path being clean)"
    c = VideoRateController(start_bps=1_000_000)
    c.set_picture(320, 240)
    assert c.update(0.0, 0.0, 30.0, 30.0).target_bps == 161_280, "0.07 bit a pixel at 30 fps, not more"


def test_uplink_cap_is_cut_while_frames_queue_and_raised_when_calm() -> None:
    u = UplinkController(min_height=240)
    assert u.update(0.0, 500.0, frame_height=480) is None, "the first seconds (connecting) do not count"
    assert u.update(5.0, 80.0) is None, "one late frame is not a queue"
    assert u.update(5.3, 90.0) is None, "nor a late spell shorter than a delay step takes to show in the RTT"
    first = u.update(5.9, 90.0, frame_height=480)
    assert first is not None and first.max_bitrate_bps == 480_000 and first.scale_down == 1.0, "60 % of the start"
    assert u.update(6.5, 80.0, frame_height=480) is None, "under the cap, a frame interval of lateness is pacing"
    mid = u.update(6.6, 95.0, frame_height=480)
    assert mid is not None and mid.max_bitrate_bps == 288_000
    assert mid.scale_down == 2.0 and mid.max_fps == 30.0, "under 400 kbit/s: half the resolution"
    assert u.update(6.7, 95.0) is None, "at most one cut per 0.5 s"
    second = u.update(7.1, 95.0, frame_height=240)
    assert second is not None and second.max_bitrate_bps == 172_800 and second.scale_down == 2.0
    third = u.update(7.7, 95.0, frame_height=240)
    assert third is not None and third.max_bitrate_bps == 120_000 and third.max_fps == 15.0, \
        "never under the floor; under 150 kbit/s fewer frames, each still readable"
    assert third.scale_down == 2.0, "under 200 kbit/s a quarter, but not under min_height (240 of 480 lines)"
    v = UplinkController(min_height=96)
    v.update(0.0, 0.0, frame_height=480)
    asked = [v.update(t, 95.0, frame_height=480) for t in (5.0, 5.9, 6.5, 7.1, 7.7)]
    low = [a for a in asked if a is not None][-1]
    assert low.max_bitrate_bps < 200_000 and low.scale_down == 4.0, low
    q = UplinkController()
    assert q.update(0.0, 0.0) is None and q.update(5.0, 70.0) is None
    deep = q.update(6.0, 250.0, incoming_bps=300_000)
    assert deep is not None and deep.max_bitrate_bps == 180_000, "a growing queue: 60 % of what gets through, at once"
    assert UplinkController(min_height=480).update(0.0, 0) is None
    assert u.update(8.2, 10.0) is None and u.update(10.7, 10.0) is None, "calm for less than 3 s: no change"
    back = u.update(11.3, 10.0)
    assert back is not None and back.max_bitrate_bps == 150_000 and u.level > 0


def test_uplink_reads_a_growing_transit_as_a_queue_and_a_step_as_none() -> None:
    step, queue = UplinkController(), UplinkController()
    step.update(0.0, 0.0, 480)
    queue.update(0.0, 0.0, 480)
    for i in range(90):  # 3 s of frames after the warm-up
        t = 6.0 + i / 30
        arrival = 0.0 if i < 10 else 65.0  # the path's delay steps up 65 ms one way, and stays
        assert step.update(t, 0.0, 480, None, arrival) is None, "a step in delay is no queue"
        grow = max(0.0, (i - 10) * 8.0)  # transit grows 240 ms a second: a queue filling
        req = queue.update(t, 0.0, 480, None, grow)
        if req is not None:
            break
    assert req is not None and t < 7.8, "a filling queue is cut within ~1.5 s, though late_ms (discounted) says 0"


def test_uplink_reads_a_standing_queue_on_the_way_in_by_its_share_of_the_rtt() -> None:
    step, queue = UplinkController(), UplinkController()
    step.update(0.0, 0.0, 480)
    queue.update(0.0, 0.0, 480)
    req = None
    for i in range(60):
        t = 6.0 + i / 30
        # a step in delay: 65 ms each way, the RTT up 130 ms (the estimate has caught up)
        assert step.update(t, 0.0, 480, None, 65.0, 130.0) is None, "half the RTT's rise: both ways, a step"
        # a standing queue on the way in: frames 300 ms late, the RTT up 330 ms (a little queue back too)
        req = req or queue.update(t, 0.0, 480, None, 300.0, 330.0)
    assert req is not None and req.max_bitrate_bps < 800_000, "cut, though late_ms (discounted) says 0"


def test_video_starves_to_a_frame_a_second_when_the_path_cannot_hold_its_floor() -> None:
    c = VideoRateController(start_bps=60_000)
    for i in range(6):  # at the floor, and the path still queues (RTT 250 ms over a 30 ms floor)
        rate = c.update(i * 0.25, 0.0, 280.0, 30.0)
    assert c.starved and rate.target_bps == 20_000 and rate.max_fps == 1.0, rate
    for i in range(6, 20):  # 3.5 s clean
        rate = c.update(i * 0.25, 0.0, 31.0, 30.0)
    assert not c.starved and rate.target_bps >= 60_000 and rate.max_fps == 10.0, rate


def test_a_step_in_delay_that_starving_does_not_remove_becomes_the_floor() -> None:
    c = VideoRateController(start_bps=60_000)
    for i in range(6):  # at the floor, RTT 150 ms over a 20 ms floor: starve, as for a queue of ours
        c.update(i * 0.25, 0.0, 170.0, 20.0)
    assert c.starved
    for i in range(6, 16):  # starving did not bring it down: the path's delay, not our queue
        c.update(i * 0.25, 0.0, 170.0, 20.0)
    assert not c.starved and c.floor_shift_ms == 150.0
    for i in range(16, 40):  # no more cuts at that delay: the video comes back up
        rate = c.update(i * 0.25, 0.0, 171.0, 20.0)
    assert rate.target_bps > 60_000 and rate.max_fps == 10.0
    c.update(11.0, 0.0, 21.0, 20.0)
    assert c.floor_shift_ms == 0.0, "the delay went back down: the floor is the path's again"


def test_a_results_only_uplink_asks_for_the_lines_the_analysis_uses_from_the_first_frame() -> None:
    u = UplinkController(max_height=240)
    first = u.update(0.0, 0.0, frame_height=480)
    assert first is not None and first.scale_down == 2.0 and first.max_fps == 30.0, "480 lines: half, at once"
    assert first.max_bitrate_bps == 345_600, "and the bits such a picture needs (0.15 bit a pixel at 30 fps)"
    assert u.update(0.1, 0.0, frame_height=240) is None and u.level == 0, "no congestion cap"
    for t in (5.0, 5.9):
        cut = u.update(t, 100.0, frame_height=240)  # 67 ms after the ceiling's pacing (a frame interval)
    assert cut is not None and cut.max_bitrate_bps == 207_360 and cut.scale_down == 2.0, "a cut keeps to the ceiling"
    for t in (6.0, 9.0, 12.1, 15.2):  # raised by a quarter every 3 s calm: 345.6, 432, then the ceiling
        back = u.update(t, 0.0, frame_height=240)
    assert back is not None and back.scale_down == 2.0 and back.max_bitrate_bps == 345_600, "and lifting the cap"
    assert UplinkController().update(0.0, 0.0, frame_height=480) is None, "no ceiling: nothing asked at first"
    assert UplinkController(max_height=720).update(0.0, 0.0, frame_height=480) is None, "smaller than the ceiling"
    assert UplinkController(max_height=240).update(0.0, 0.0, frame_height=720).scale_down == 3.0  # type: ignore[union-attr]
