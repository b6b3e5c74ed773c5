"""Network estimator and budget arithmetic with plain numbers."""

from __future__ import annotations

import pytest

from edge_app.budget import frame_budget, horizon, send_time_ms
from streams.netstats import BitrateEstimator, RttEstimator, snapshot


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


def test_horizon_counts_the_exits_that_fit() -> None:
    costs = [10.0, 15.0, 20.0]
    assert horizon(100, costs) == 3
    assert horizon(44.9, costs) == 2
    assert horizon(25, costs) == 2
    assert horizon(9, costs) == 1, "exit 1 always runs"
    assert horizon(-50, costs) == 1


def test_a_step_up_is_followed_within_two_samples_and_a_step_down_gradually() -> None:
    rtt = RttEstimator(prior_ms=50, alpha=0.3, lookahead_s=0.0)
    for i in range(20):
        rtt.add(i * 0.25, 20.0)
    rtt.add(5.0, 150.0)
    assert rtt.smoothed_ms < 70, "one sample is not yet a step"
    rtt.add(5.25, 150.0)
    assert rtt.smoothed_ms == pytest.approx(150.0), "two in a row are"
    rtt.add(5.5, 20.0)
    assert 100 < rtt.smoothed_ms < 150, "falls at the average's pace"
    for i in range(12):
        rtt.add(5.75 + i * 0.25, 20.0)
    assert rtt.smoothed_ms < 25, "and is back within about three seconds at four samples a second"
