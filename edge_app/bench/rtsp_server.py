"""A real RTSP camera for tests and demos: GStreamer's gst-rtsp-server serving JPEG frames as H.264.

Run it with the system Python (GStreamer's bindings come from Debian, not PyPI)::

    apt-get install python3-gi gir1.2-gst-rtsp-server-1.0 gstreamer1.0-plugins-{base,good,ugly}
    /usr/bin/python3 edge_app/bench/rtsp_server.py --frames DIR/%05d.jpg --port 8554 [--fps 30] [--size 640x480]

It serves ``rtsp://127.0.0.1:PORT/cam`` (one shared encoder for all
clients), loops the frames forever and prints ``READY rtsp://...`` once it
listens.  ``edge_app.bench.testvideo.write_jpegs`` writes such a frame folder.
"""

from __future__ import annotations

import argparse
import signal
import sys

import gi

gi.require_version("Gst", "1.0")
gi.require_version("GstRtsp", "1.0")
gi.require_version("GstRtspServer", "1.0")
from gi.repository import GLib, Gst, GstRtsp, GstRtspServer  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--frames", required=True, help="printf pattern of JPEG files, e.g. dir/%%05d.jpg")
    ap.add_argument("--port", type=int, default=8554)
    ap.add_argument("--address", default="127.0.0.1")
    ap.add_argument("--fps", type=int, default=30)
    ap.add_argument("--size", default=None, help="scale to WxH (default: the files' size)")
    ap.add_argument("--mount", default="/cam")
    ap.add_argument("--bframes", type=int, default=0, help="B-frames between references (a camera that reorders)")
    ap.add_argument("--protocols", choices=["tcp", "udp", "both"], default="both",
                    help="RTSP lower transports the server accepts (a camera that refuses one answers 461)")
    args = ap.parse_args()

    Gst.init(None)
    scale = ""
    if args.size:
        w, h = args.size.lower().split("x")
        scale = f"! videoscale ! video/x-raw,width={int(w)},height={int(h)} ! videoconvert "  # caps between elements
    # zerolatency rules B-frames out; a camera that sends them (bframes > 0) is encoded without it
    x264 = ("x264enc tune=zerolatency speed-preset=ultrafast" if not args.bframes else
            f"x264enc speed-preset=ultrafast bframes={args.bframes} b-adapt=false")
    profile = "! video/x-h264,profile=high " if args.bframes else ""  # rtph264pay would settle on baseline
    launch = (f"( multifilesrc location={args.frames} loop=true caps=image/jpeg,framerate={args.fps}/1 "
              f"! jpegdec ! videoconvert {scale}! video/x-raw,format=I420 "
              f"! {x264} key-int-max={args.fps} bitrate=2000 {profile}"
              f"! rtph264pay name=pay0 pt=96 config-interval=1 )")
    server = GstRtspServer.RTSPServer()
    server.set_address(args.address)
    server.set_service(str(args.port))
    factory = GstRtspServer.RTSPMediaFactory()
    factory.set_launch(launch)
    factory.set_shared(True)
    lower = {"tcp": GstRtsp.RTSPLowerTrans.TCP, "udp": GstRtsp.RTSPLowerTrans.UDP,
             "both": GstRtsp.RTSPLowerTrans.TCP | GstRtsp.RTSPLowerTrans.UDP}
    factory.set_protocols(lower[args.protocols])
    server.get_mount_points().add_factory(args.mount, factory)
    if server.attach(None) == 0:
        print(f"cannot listen on {args.address}:{args.port}", file=sys.stderr)
        return 1
    loop = GLib.MainLoop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        GLib.unix_signal_add(GLib.PRIORITY_DEFAULT, sig, loop.quit)
    print(f"READY rtsp://{args.address}:{args.port}{args.mount}", flush=True)
    loop.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
