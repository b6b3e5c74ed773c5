"""Network estimator and budget arithmetic with plain numbers."""

from __future__ import annotations

import pytest

from edge_app.decision.budget import frame_budget, horizon, late_uplink_ms, send_time_ms
from streams.netstats import ArrivalDelay, BitrateEstimator, RttEstimator, snapshot


def test_prior_until_the_first_sample() -> None:
    rtt, br = RttEstimator(prior_ms=50), BitrateEstimator(prior_bps=500_000)
    est = snapshot(rtt, br)
    assert est.rtt_ms == 50 and est.rtt_from_prior and est.bitrate_bps == 500_000 and est.bitrate_from_prior
    rtt.add(0.0, 4.0)
    br.add(300_000)
    est = snapshot(rtt, br)
    assert est.rtt_ms == 4.0 and not est.rtt_from_prior and est.bitrate_bps == 300_000


def test_one_spike_does_not_flip_the_estimate() -> None:
    rtt = RttEstimator(prior_ms=50, alpha=0.2, lookahead_s=0.0)
    for i in range(20):
        rtt.add(i * 0.5, 20.0)
    rtt.add(10.0, 200.0)
    assert rtt.smoothed_ms == pytest.approx(20 + 0.2 * 180)
    for i in range(21, 30):
        rtt.add(i * 0.5, 20.0)
    assert rtt.smoothed_ms < 25


def test_trend_sees_a_worsening_network_early() -> None:
    rtt = RttEstimator(prior_ms=50, alpha=0.2, lookahead_s=1.0)
    for i in range(10):
        rtt.add(i * 0.5, 20.0 + 20.0 * i)  # +40 ms per second
    assert rtt.trend_ms_per_s == pytest.approx(40.0)
    assert rtt.estimate_ms == pytest.approx(rtt.smoothed_ms + 40.0)
    improving = RttEstimator(prior_ms=50, lookahead_s=1.0)
    for i in range(10):
        improving.add(i * 0.5, 200.0 - 10.0 * i)
    assert improving.estimate_ms == improving.smoothed_ms, "only a worsening trend is projected"


def test_odd_samples_are_clamped() -> None:
    rtt = RttEstimator(prior_ms=50, min_ms=0.5, max_ms=1000)
    rtt.add(0.0, -3.0)
    assert rtt.smoothed_ms == 0.5
    rtt.add(1.0, 1e9)
    assert rtt.smoothed_ms <= 1000


def test_budget_arithmetic() -> None:
    assert send_time_ms(12_500, 1_000_000) == pytest.approx(100.0)
    b = frame_budget(total_ms=250, rtt_ms=40, frame_bytes=6_250, bitrate_bps=500_000, waited_ms=10, margin_ms=5)
    assert b.network_ms == pytest.approx(140.0) and b.compute_ms == pytest.approx(95.0)
    with pytest.raises(ValueError):
        send_time_ms(1, 0)


def test_rtt_low_is_the_smallest_sample_of_the_window() -> None:
    rtt = RttEstimator(prior_ms=50, low_window_s=10.0)
    assert rtt.low_ms == 50, "the prior before any sample"
    for t, v in [(0.0, 30.0), (1.0, 20.0), (2.0, 150.0), (9.0, 160.0)]:
        rtt.add(t, v)
    assert rtt.low_ms == 20.0
    rtt.add(11.5, 155.0)  # the 20 ms sample (t = 1) has left the window
    assert rtt.low_ms == 150.0
    assert snapshot(rtt, BitrateEstimator(1e6)).rtt_low_ms == 150.0


def test_arrival_delay_is_transit_against_the_fastest_recent_frame() -> None:
    d = ArrivalDelay(window_s=10.0)
    # 30 fps, 90 kHz: 3000 ticks a frame; the sender's clock starts anywhere
    for n in range(30):
        assert d.add(123_456 + 3000 * n, 100.0 + n / 30 + 0.040) == pytest.approx(0.0, abs=1e-6)
    # the path gets 70 ms slower: seen on the very next frame, no round trip needed
    assert d.add(123_456 + 3000 * 30, 100.0 + 30 / 30 + 0.110) == pytest.approx(70.0)
    # a frame faster than all before it is the new baseline
    assert d.add(123_456 + 3000 * 31, 100.0 + 31 / 30 + 0.030) == pytest.approx(0.0)
    assert d.add(123_456 + 3000 * 32, 100.0 + 32 / 30 + 0.045) == pytest.approx(15.0)


def test_arrival_delay_unwraps_the_rtp_clock_and_survives_a_restart() -> None:
    d = ArrivalDelay(window_s=10.0)
    start = (1 << 32) - 3000 * 5
    for n in range(10):  # wraps after 5 frames
        assert d.add((start + 3000 * n) & 0xFFFFFFFF, 5.0 + n / 30) == pytest.approx(0.0, abs=1e-6)
    # the sender restarts its clock at a random offset (hours away): not reported as delay
    restart = (start + 3000 * 10 + (1 << 30)) & 0xFFFFFFFF
    assert d.add(restart, 5.0 + 10 / 30) == pytest.approx(0.0)
    assert d.add(restart + 3000, 5.0 + 11 / 30 + 0.020) == pytest.approx(20.0)


def test_late_uplink_counts_only_what_the_rtt_estimate_does_not() -> None:
    # RTT estimate still at its low (20 ms) while the frame came 70 ms late: all 70 ms are extra
    assert late_uplink_ms(70.0, rtt_ms=20.0, rtt_low_ms=20.0) == pytest.approx(70.0)
    # the estimate has caught up with a 160 ms round trip: its up-leg already holds 70 ms more
    assert late_uplink_ms(70.0, rtt_ms=160.0, rtt_low_ms=20.0) == pytest.approx(0.0)
    assert late_uplink_ms(0.0, rtt_ms=20.0, rtt_low_ms=20.0) == 0.0
    b = frame_budget(total_ms=300, rtt_ms=20, frame_bytes=0, bitrate_bps=1e6, waited_ms=0, margin_ms=0, late_ms=70)
    assert b.network_ms == pytest.approx(90.0) and b.compute_ms == pytest.approx(210.0) and b.late_ms == 70.0
    # the way back assumed as late as the way in (a symmetric path): the whole step's round trip at once
    b = frame_budget(total_ms=300, rtt_ms=20, frame_bytes=0, bitrate_bps=1e6, waited_ms=0, late_ms=70,
                     return_factor=1.0)
    assert b.network_ms == pytest.approx(160.0) and b.compute_ms == pytest.approx(140.0) and b.late_ms == 70.0


def test_horizon_counts_the_exits_that_fit() -> None:
    costs = [10.0, 15.0, 20.0]
    assert horizon(100, costs) == 3
    assert horizon(44.9, costs) == 2
    assert horizon(25, costs) == 2
    assert horizon(9, costs) == 1, "exit 1 always runs"
    assert horizon(-50, costs) == 1


def test_a_step_up_is_followed_within_two_samples_and_a_step_down_within_four() -> None:
    rtt = RttEstimator(prior_ms=50, alpha=0.3, lookahead_s=0.0)
    for i in range(20):
        rtt.add(i * 0.25, 20.0)
    rtt.add(5.0, 150.0)
    assert rtt.smoothed_ms < 70, "one sample is not yet a step"
    rtt.add(5.25, 150.0)
    assert rtt.smoothed_ms == pytest.approx(150.0), "two in a row are"
    rtt.add(5.5, 20.0)
    assert 100 < rtt.smoothed_ms < 150, "one low sample: falls at the average's pace"
    rtt.add(5.75, 20.0)
    rtt.add(6.0, 30.0)
    assert rtt.smoothed_ms > 40, "three in a row are not yet a fall"
    rtt.add(6.25, 20.0)
    assert rtt.smoothed_ms == pytest.approx(30.0), "four in a row are: the highest of them, at once"
