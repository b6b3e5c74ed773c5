"""Start and stop ``edge_app/bench/rtsp_server.py`` (GStreamer, system Python) from the app's Python."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from pathlib import Path

SERVER = Path(__file__).resolve().parent / "rtsp_server.py"
SYSTEM_PYTHON = "/usr/bin/python3"


def gst_rtsp_available() -> bool:
    """The system Python has GStreamer's RTSP server (apt-get install python3-gi gir1.2-gst-rtsp-server-1.0)."""
    if not os.path.exists(SYSTEM_PYTHON) or shutil.which(SYSTEM_PYTHON) is None:
        return False
    probe = subprocess.run([SYSTEM_PYTHON, "-c", "import gi; gi.require_version('GstRtspServer', '1.0'); "
                            "from gi.repository import GstRtspServer"], capture_output=True, check=False)
    return probe.returncode == 0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RtspServer:
    """gst-rtsp-server in a subprocess of the system Python; start() waits for READY."""

    def __init__(self, frames: Path, port: int, fps: int = 30, size: str | None = None,
                 protocols: str = "both", bframes: int = 0) -> None:
        self.cmd = [SYSTEM_PYTHON, str(SERVER), "--frames", str(frames), "--port", str(port), "--fps", str(fps),
                    "--protocols", protocols, "--bframes", str(bframes)]
        if size:
            self.cmd += ["--size", size]
        self.url = f"rtsp://127.0.0.1:{port}/cam"
        self.proc: subprocess.Popen[str] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line.startswith("READY"):
            self.stop()
            raise RuntimeError(f"RTSP test server did not start: {line!r}")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
            self.proc = None
