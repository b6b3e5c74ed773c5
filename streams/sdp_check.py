"""Checks on a client's SDP offer before aiortc acts on it: a reason in words, or None.

aiortc trusts the offer's structure: a BUNDLE group naming a missing m-section raises ``AttributeError`` deep in
``setRemoteDescription``; a tiny ``a=max-message-size`` makes every data-channel send raise ``ValueError``; thousands
of m-sections make thousands of ICE transports.  ``offer_problem`` finds these first, so the server can answer 400
with a reason instead of 500 or a flood of tracebacks.
"""

from __future__ import annotations

from aiortc import sdp

MAX_MEDIA_SECTIONS = 64  # a browser sends one per track and one for data; this bounds a hostile offer
MIN_MESSAGE_BYTES = 2048  # a per-frame result is about 1 KB; a peer that takes less cannot get results


def offer_problem(text: str) -> str | None:
    """Why this offer cannot be used, or None when these checks pass (aiortc may still refuse it)."""
    try:
        desc = sdp.SessionDescription.parse(text)
    except (ValueError, KeyError, IndexError, TypeError, AttributeError, AssertionError) as exc:
        return f"the SDP does not parse ({type(exc).__name__}: {exc})"
    if not desc.media:
        return "the SDP has no m= section (no media and no data channel to answer)"
    if len(desc.media) > MAX_MEDIA_SECTIONS:
        return f"the offer has {len(desc.media)} m-sections; at most {MAX_MEDIA_SECTIONS} are taken"
    mids = [m.rtp.muxId for m in desc.media if m.kind in ("audio", "video")]
    mids += [m.rtp.muxId for m in desc.media if m.kind == "application"]
    for group in desc.group:
        missing = [item for item in group.items if item not in mids]
        if missing:
            return (f"a=group:{group.semantic} names m-sections the offer does not have: {missing} "
                    f"(its a=mid values are {[m for m in mids if m]})")
    for m in desc.media:
        caps = m.sctpCapabilities
        if m.kind == "application" and caps is not None and 0 < caps.maxMessageSize < MIN_MESSAGE_BYTES:
            return (f"a=max-message-size:{caps.maxMessageSize} is too small for per-frame results: the data "
                    f"channel needs at least {MIN_MESSAGE_BYTES} bytes (browsers allow 65536 or more)")
    return None
