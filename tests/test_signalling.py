"""The answer plan, as a pure function of the offer's m-lines and what was asked (no aiortc peer involved), and the
offers that real clients make, read by ``offered_lines``."""

from __future__ import annotations

import pytest
from aiortc import RTCPeerConnection

from edge_app.doors.signalling import OfferedLine, PlanRefused, offered_lines, plan_answer

V8, H264 = "video/VP8", "video/H264"


def line(mid: str, kind: str = "video", direction: str = "sendrecv", codecs: tuple[str, ...] = (V8, H264)
         ) -> OfferedLine:
    return OfferedLine(mid, kind, direction, codecs)


def test_a_browser_that_sends_its_camera_and_wants_video_back() -> None:
    plan = plan_answer([line("0", "audio"), line("1"), line("2", "application", codecs=())], camera=None)
    assert (plan.analysed, plan.back) == ("1", "1")
    assert plan.directions == {"0": "inactive", "1": "sendrecv"}, "audio is never decoded"


def test_a_page_that_draws_over_its_own_camera_gets_no_video_back() -> None:
    plan = plan_answer([line("0", direction="sendonly")], camera=None)
    assert (plan.analysed, plan.back, plan.directions) == ("0", None, {"0": "recvonly"})


def test_only_the_first_sent_video_is_analysed() -> None:
    plan = plan_answer([line("a", direction="sendonly"), line("b", direction="sendonly"),
                        line("c", direction="recvonly")], camera=None)
    assert plan.analysed == "a" and plan.back == "c"
    assert plan.directions == {"a": "recvonly", "b": "inactive", "c": "sendonly"}


def test_a_camera_viewer_gets_video_on_the_first_line_it_receives_on() -> None:
    plan = plan_answer([line("0", direction="sendrecv"), line("1", direction="recvonly")], camera="door")
    assert plan.analysed is None and plan.back == "0"
    assert plan.directions == {"0": "sendonly", "1": "inactive"}, "a viewer's own camera would be decoded for nothing"
    assert plan.codec_first is None


def test_the_cameras_own_h264_goes_first_only_where_it_was_offered_and_can_go() -> None:
    assert plan_answer([line("0", direction="recvonly")], "door", forward_h264=True).codec_first == H264
    assert plan_answer([line("0", direction="recvonly", codecs=(V8,))], "door", forward_h264=True).codec_first is None
    assert plan_answer([line("0", direction="recvonly")], "door", forward_h264=False).codec_first is None


def test_nothing_to_analyse_is_refused_with_the_reason() -> None:
    for lines in ([line("0", "audio")], [line("0", direction="recvonly")], []):
        with pytest.raises(PlanRefused, match="sends no video track"):
            plan_answer(lines, camera=None)
    assert plan_answer([line("0", "audio")], camera="door").back is None, "a results-only viewer is fine"


@pytest.mark.parametrize(("direction", "sends", "receives"), [("sendonly", True, False), ("recvonly", False, True),
                                                              ("sendrecv", True, True)])
async def test_offered_lines_reads_a_real_offer(direction: str, sends: bool, receives: bool) -> None:
    pc = RTCPeerConnection()
    pc.addTransceiver("audio", direction="sendrecv")
    pc.addTransceiver("video", direction=direction)
    pc.createDataChannel("results")
    await pc.setLocalDescription(await pc.createOffer())
    lines = offered_lines(pc.localDescription.sdp)
    await pc.close()
    assert [(x.kind, x.mid) for x in lines] == [("audio", "0"), ("video", "1"), ("application", "2")]
    video = lines[1]
    assert (video.peer_sends, video.peer_receives) == (sends, receives)
    assert video.codecs[0] == V8 and H264 in video.codecs, video.codecs
