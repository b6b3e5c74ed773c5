"""From an offer and what was asked to an answer plan: a pure function, tested without aiortc.

Only the tracks the app uses are received: the browser's first video track (when it analyses its own camera) and
one video m-line to send video back on. Every other m-line (audio, more video) is answered ``inactive``, so
nothing is decoded for it. Video goes back only on an m-line where the peer asked to receive video (a page that
shows its own camera and draws the results over it offers ``sendonly``: nothing is rendered or encoded for it),
the analysed m-line first.
"""

from __future__ import annotations

from dataclasses import dataclass

from aiortc.sdp import SessionDescription


class PlanRefused(ValueError):
    """The offer cannot give what was asked; ``str()`` says why, for the HTTP 400."""


@dataclass(frozen=True)
class OfferedLine:
    """One m-line of the offer, from the offerer's side."""

    mid: str | None
    kind: str  # "audio", "video", "application"
    direction: str  # the offerer's: "sendrecv", "sendonly", "recvonly", "inactive"
    codecs: tuple[str, ...] = ()  # mime types in the offer's order, e.g. "video/VP8"

    @property
    def peer_sends(self) -> bool:
        return self.direction in ("sendrecv", "sendonly")

    @property
    def peer_receives(self) -> bool:
        return self.direction in ("sendrecv", "recvonly")


@dataclass(frozen=True)
class AnswerPlan:
    analysed: str | None  # mid of the m-line whose video is analysed (a browser's own camera)
    back: str | None  # mid of the m-line that carries video back
    directions: dict[str, str]  # mid -> our direction in the answer, for every audio/video m-line
    codec_first: str | None = None  # the codec to put first on ``back`` (the camera's own H.264)


def offered_lines(sdp: str) -> list[OfferedLine]:
    """The offer's m-lines (``aiortc.sdp`` parses; the offer was checked by ``streams.sdp_check`` before)."""
    return [OfferedLine(m.rtp.muxId or None, m.kind, m.direction or "sendrecv",
                        tuple(c.mimeType for c in m.rtp.codecs)) for m in SessionDescription.parse(sdp).media]


def plan_answer(lines: list[OfferedLine], camera: str | None, forward_h264: bool = False) -> AnswerPlan:
    """The answer for ``lines``: a camera viewer (``camera`` named) or a browser that sends its camera (None).
    ``forward_h264``: the viewer asked for the camera's own picture and the camera's H.264 can go as it is."""
    media = [line for line in lines if line.kind in ("audio", "video") and line.mid is not None]
    video = [line for line in media if line.kind == "video"]
    analysed = next((line for line in video if line.peer_sends), None) if camera is None else None
    if camera is None and analysed is None:
        raise PlanRefused("the offer sends no video track and names no camera: nothing to analyse (add a video "
                          "track, or ask for one of the configured cameras)")
    back = (analysed if analysed is not None and analysed.peer_receives
            else next((line for line in video if line.peer_receives), None))
    directions: dict[str, str] = {}
    for line in media:
        assert line.mid is not None
        if line is back and line is analysed:
            directions[line.mid] = "sendrecv"
        elif line is back:
            directions[line.mid] = "sendonly"  # a camera viewer's own video would be decoded for nothing
        elif line is analysed:
            directions[line.mid] = "recvonly"
        else:
            directions[line.mid] = "inactive"
    codec_first = ("video/H264" if forward_h264 and back is not None and camera is not None
                   and any(c.lower() == "video/h264" for c in back.codecs) else None)
    return AnswerPlan(None if analysed is None else analysed.mid, None if back is None else back.mid, directions,
                      codec_first)
