"""A WebRTC peer we did not write: GStreamer's webrtcbin, driven from the system Python with gi.

    /usr/bin/python3 tests/support/webrtcbin_peer.py --url http://127.0.0.1:PORT --codec vp8|h264 \\
        --seconds 8 --out result.json [--whip]

It sends a live test pattern (VP8 or H.264, 320x240 at 30 fps), opens a "results" data channel (answering the
server's pings), posts its offer to ``/offer`` as a browser page would (webrtcbin offers ``a=setup:actpass``, so
the DTLS role is the server's to choose), decodes the video that comes back, and writes what it saw as JSON:
``{"state", "frames_back", "results", "first_result", "answer_setup", "codec", "error"}``. With ``--whip`` it is a
WHIP sender instead (RFC 9725: its camera only, ``sendonly``): the offer goes to ``/whip`` as ``application/sdp``,
the answer comes back ``201 Created`` with a ``Location``, and at the end the session is ended with ``DELETE`` on
it (``"location"``, ``"deleted"``: the DELETE's status).  Its ICE agent (libnice)
gathers on 127.0.0.1 only, so no packet leaves this machine.

Needs: python3-gi gir1.2-gst-plugins-bad-1.0 gir1.2-nice-0.1 gstreamer1.0-plugins-{base,good,bad,ugly}
gstreamer1.0-nice gstreamer1.0-libav (``.ci/test`` installs them).
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.request

import gi

gi.require_version("Gst", "1.0")
gi.require_version("GstWebRTC", "1.0")
gi.require_version("GstSdp", "1.0")
gi.require_version("Nice", "0.1")
from gi.repository import GLib, Gst, GstSdp, GstWebRTC, Nice  # noqa: E402

ENCODERS = {
    "vp8": "vp8enc deadline=1 target-bitrate=400000 keyframe-max-dist=30 ! rtpvp8pay pt=96 "
           "! application/x-rtp,media=video,encoding-name=VP8,payload=96",
    "h264": "x264enc tune=zerolatency speed-preset=ultrafast key-int-max=30 bitrate=400 "
            "! video/x-h264,profile=constrained-baseline ! rtph264pay config-interval=-1 pt=102 "
            "! application/x-rtp,media=video,encoding-name=H264,payload=102",
}

DECODERS = {"VP8": "queue ! rtpvp8depay ! vp8dec", "H264": "queue ! rtph264depay ! h264parse ! avdec_h264"}


class Peer:
    def __init__(self, url: str, codec: str, seconds: float, whip: bool = False) -> None:
        self.url = url.rstrip("/")
        self.codec = codec
        self.whip = whip
        self.out: dict[str, object] = {"state": "new", "frames_back": 0, "results": 0, "first_result": None,
                                       "answer_setup": None, "codec": codec, "error": None, "location": None,
                                       "deleted": None}
        self.loop = GLib.MainLoop()
        self.pipe = Gst.parse_launch(
            "webrtcbin name=wb bundle-policy=max-bundle "
            "videotestsrc is-live=true pattern=ball ! video/x-raw,width=320,height=240,framerate=30/1 "
            f"! videoconvert ! queue ! {ENCODERS[codec]} ! wb.")
        self.wb = self.pipe.get_by_name("wb")
        # GStreamer 1.22's ice-agent getter hands out a reference it does not own: keep the wrappers alive for the
        # pipeline's lifetime, or Python's unref destroys webrtcbin's ICE agent
        self.ice = self.wb.get_property("ice-agent")
        self.nice = self.ice.get_property("agent")
        loopback = Nice.Address.new()
        loopback.set_from_string("127.0.0.1")
        self.nice.add_local_address(loopback)
        self.wb.connect("on-negotiation-needed", self.on_negotiation_needed)
        self.wb.connect("notify::ice-gathering-state", self.on_gathering)
        self.wb.connect("notify::connection-state", self.on_connection_state)
        self.wb.connect("pad-added", self.on_pad_added)
        bus = self.pipe.get_bus()
        bus.add_signal_watch()
        bus.connect("message::error", self.on_error)
        self.channel = None
        self.posted = False
        GLib.timeout_add(int(seconds * 1000), self.finish)

    def run(self) -> dict[str, object]:
        self.pipe.set_state(Gst.State.PLAYING)
        direction = GstWebRTC.WebRTCRTPTransceiverDirection
        for t in range(self.wb.emit("get-transceivers").len):  # the test pattern's m-line also receives (not WHIP)
            self.wb.emit("get-transceiver", t).set_property("direction",
                                                            direction.SENDONLY if self.whip else direction.SENDRECV)
        self.loop.run()
        if self.whip and self.out["location"]:
            req = urllib.request.Request(f"{self.url}{self.out['location']}", method="DELETE")
            try:
                self.out["deleted"] = urllib.request.urlopen(req, timeout=10).status
            except Exception as exc:
                self.out["deleted"] = getattr(exc, "code", str(exc))
        self.pipe.set_state(Gst.State.NULL)
        return self.out

    def finish(self) -> bool:
        self.loop.quit()
        return False

    def on_error(self, bus: Gst.Bus, message: Gst.Message) -> None:
        err, debug = message.parse_error()
        self.fail(f"GStreamer error from {message.src.get_name()}: {err.message} ({debug})")

    def fail(self, message: str) -> None:
        self.out["error"] = message
        self.loop.quit()

    # --- signalling ---------------------------------------------------------------------------------------
    def on_negotiation_needed(self, wb: Gst.Element) -> None:
        self.channel = wb.emit("create-data-channel", "results",
                               Gst.Structure.new_from_string("options,ordered=false,max-retransmits=0"))
        self.channel.connect("on-message-string", self.on_message)
        promise = Gst.Promise.new_with_change_func(self.on_offer_created, None)
        wb.emit("create-offer", None, promise)

    def on_offer_created(self, promise: Gst.Promise, _: object) -> None:
        reply = promise.get_reply()
        offer = reply.get_value("offer") if reply is not None and reply.has_field("offer") else None
        if offer is None:
            self.fail(f"webrtcbin made no offer: {reply.to_string() if reply is not None else 'no reply'}")
            return
        self.wb.emit("set-local-description", offer, Gst.Promise.new())

    def on_gathering(self, wb: Gst.Element, _: object) -> None:
        if wb.get_property("ice-gathering-state") == GstWebRTC.WebRTCICEGatheringState.COMPLETE and not self.posted:
            self.posted = True
            GLib.idle_add(self.post_offer)

    def post_offer(self) -> bool:
        sdp = self.wb.get_property("local-description").sdp.as_text()
        if self.whip:
            req = urllib.request.Request(f"{self.url}/whip", sdp.encode(), {"Content-Type": "application/sdp"})
        else:
            body = json.dumps({"sdp": sdp, "type": "offer"}).encode()
            req = urllib.request.Request(f"{self.url}/offer", body, {"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=15) as r:
                text = r.read().decode()
                if self.whip:
                    self.out["location"] = r.headers.get("Location")
                    if r.status != 201 or r.headers.get_content_type() != "application/sdp":
                        self.fail(f"POST /whip: {r.status} {r.headers.get_content_type()}, not 201 application/sdp")
                        return False
        except Exception as exc:  # an HTTP error carries the server's reason in its body
            detail = exc.read().decode() if hasattr(exc, "read") else ""
            self.fail(f"POST {'/whip' if self.whip else '/offer'}: {exc} {detail}")
            return False
        answer_sdp = text if self.whip else json.loads(text)["sdp"]
        setup = [line for line in answer_sdp.splitlines() if line.startswith("a=setup:")]
        self.out["answer_setup"] = setup[0] if setup else None
        _, msg = GstSdp.SDPMessage.new_from_text(answer_sdp)
        desc = GstWebRTC.WebRTCSessionDescription.new(GstWebRTC.WebRTCSDPType.ANSWER, msg)
        self.wb.emit("set-remote-description", desc, Gst.Promise.new())
        return False

    def on_connection_state(self, wb: Gst.Element, _: object) -> None:
        state = wb.get_property("connection-state").value_nick
        self.out["state"] = state
        if state == "failed":
            self.fail("the peer connection failed (ICE or DTLS)")

    # --- what comes back ----------------------------------------------------------------------------------
    def on_message(self, channel: object, text: str) -> None:
        msg = json.loads(text)
        if msg.get("type") == "ping":
            channel.emit("send-string", json.dumps({"type": "pong", "id": msg["id"]}))
        elif msg.get("type") == "result":
            self.out["results"] = int(self.out["results"]) + 1  # type: ignore[call-overload]
            if self.out["first_result"] is None:
                self.out["first_result"] = {k: msg.get(k) for k in ("exit", "deadline_met", "smoothed")}

    def on_pad_added(self, wb: Gst.Element, pad: Gst.Pad) -> None:
        if pad.direction != Gst.PadDirection.SRC:
            return
        caps = pad.get_current_caps() or pad.query_caps(None)
        name = caps.get_structure(0).get_string("encoding-name") or "?"
        chain = DECODERS.get(name.upper())
        if chain is None:
            self.fail(f"the server sent {name}, which this peer does not decode")
            return
        decode = Gst.parse_bin_from_description(f"{chain} ! fakesink name=frames signal-handoffs=true sync=false",
                                                True)
        decode.get_by_name("frames").connect("handoff", self.on_frame)
        self.out["codec_back"] = name
        self.pipe.add(decode)
        decode.sync_state_with_parent()
        pad.link(decode.get_static_pad("sink"))

    def on_frame(self, sink: Gst.Element, buf: Gst.Buffer, pad: Gst.Pad) -> None:
        self.out["frames_back"] = int(self.out["frames_back"]) + 1  # type: ignore[call-overload]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", required=True)
    ap.add_argument("--codec", choices=sorted(ENCODERS), default="vp8")
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--out", required=True)
    ap.add_argument("--whip", action="store_true", help="a WHIP sender (POST /whip, application/sdp)")
    args = ap.parse_args()
    Gst.init(None)
    out = Peer(args.url, args.codec, args.seconds, args.whip).run()
    with open(args.out, "w") as f:
        json.dump(out, f)
    print(json.dumps(out), flush=True)
    return 0 if out["error"] is None else 1


if __name__ == "__main__":
    sys.exit(main())
