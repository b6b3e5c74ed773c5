"""Budget arithmetic per frame: pure functions of plain numbers.

    compute budget = total_budget_ms - network_ms - waited_ms - safety_margin_ms
    network_ms     = rtt_ms + frame_bits / bitrate   (the frame came up, the result goes back down,
                     + late_ms * (1 + return_factor)  and the annotated frame must be sent)
    late_ms        = max(0, arrival_delay_ms - (rtt_ms - rtt_low_ms) / 2)

``late_ms`` is the part of the frame's own measured uplink delay (its
arrival against the fastest recent frame's, ``streams.netstats.ArrivalDelay``)
that the round-trip estimate does not cover yet: the up-leg then was about
``rtt_low_ms / 2``, the estimate counts ``rtt_ms / 2`` for it now.  The way
back is assumed to have slowed by ``return_factor`` times as much (1: the
symmetric path that RTT / 2 assumes too) until the RTT estimate shows it: a
delay step then cuts the budget by its whole round trip on the first late
frame, not by half of it until RTCP catches up a second later.

``horizon`` is the number of exits whose predicted cumulative cost fits; at
least 1, so that every frame gets an answer even when the deadline is lost.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Budget:
    total_ms: float
    network_ms: float
    waited_ms: float
    compute_ms: float  # may be negative: the deadline is already lost
    late_ms: float  # the uplink's; network_ms includes it and the return leg's assumed share
    arrival_delay_ms: float = 0.0  # the frame's whole transit above the path's floor (late_ms less what RTT counts)


def send_time_ms(frame_bytes: float, bitrate_bps: float) -> float:
    if bitrate_bps <= 0:
        raise ValueError("bitrate must be positive")
    return 8.0 * frame_bytes / bitrate_bps * 1e3


def late_uplink_ms(arrival_delay_ms: float, rtt_ms: float, rtt_low_ms: float) -> float:
    """The frame's extra uplink delay beyond what ``rtt_ms`` already counts (see the module text)."""
    return max(0.0, arrival_delay_ms - max(0.0, rtt_ms - rtt_low_ms) / 2)


def frame_budget(total_ms: float, rtt_ms: float, frame_bytes: float, bitrate_bps: float, waited_ms: float,
                 margin_ms: float = 0.0, late_ms: float = 0.0, return_factor: float = 0.0) -> Budget:
    network = rtt_ms + send_time_ms(frame_bytes, bitrate_bps) + late_ms * (1.0 + return_factor)
    return Budget(total_ms, network, waited_ms, total_ms - network - waited_ms - margin_ms, late_ms)


def horizon(compute_ms: float, predicted_cost_ms: Sequence[float]) -> int:
    """How many exits (from the first) fit in ``compute_ms`` given each segment's predicted cost."""
    spent, k = 0.0, 0
    for c in predicted_cost_ms:
        if spent + c > compute_ms:
            break
        spent += c
        k += 1
    return max(1, k)


def expected_frame_bytes(bitrate_bps: float, fps: float) -> float:
    """Average size of one encoded frame when the encoder holds ``bitrate_bps`` at ``fps`` frames a second."""
    return bitrate_bps / 8.0 / max(fps, 1.0)


def worst_network(network_ms: Sequence[float]) -> int | None:
    """Index of the viewer whose network costs most (a camera's budget must suit all its viewers)."""
    return max(range(len(network_ms)), key=network_ms.__getitem__) if network_ms else None
