"""Debian's mosquitto broker and its ``mosquitto_sub`` client (software we did not write), for the MQTT tests:
a broker on a free loopback port that can be stopped and started again on the same port (persistence on, so a
subscriber's session survives), TLS with certificates made by ``openssl``, a password file."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from edge_app.bench.rtsp_camera import free_port
from support.live import skip_or_fail


def need_mosquitto() -> None:
    for tool in ("mosquitto", "mosquitto_sub", "mosquitto_pub", "mosquitto_passwd"):
        if shutil.which(tool) is None and not Path(f"/usr/sbin/{tool}").exists():
            skip_or_fail(f"needs Debian's mosquitto and mosquitto-clients ({tool}; .ci/run installs them)")


def _tool(name: str) -> str:
    return shutil.which(name) or f"/usr/sbin/{name}"


@dataclass
class Tls:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def make_tls(folder: Path) -> Tls:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, by openssl."""
    folder.mkdir(parents=True, exist_ok=True)

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=folder, check=True, capture_output=True)

    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=edge-test-ca",
        "-keyout", "ca.key", "-out", "ca.pem")
    for who, subject in (("server", "/CN=127.0.0.1"), ("client", "/CN=edge-box")):
        run("req", "-newkey", "rsa:2048", "-nodes", "-subj", subject, "-keyout", f"{who}.key", "-out", f"{who}.csr")
        (folder / f"{who}.ext").write_text("subjectAltName=IP:127.0.0.1\n" if who == "server" else
                                           "extendedKeyUsage=clientAuth\n")
        run("x509", "-req", "-in", f"{who}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
            "-days", "2", "-out", f"{who}.pem", "-extfile", f"{who}.ext")
    return Tls(folder / "ca.pem", folder / "server.pem", folder / "server.key", folder / "client.pem",
               folder / "client.key")


@dataclass
class Broker:
    folder: Path
    port: int = field(default_factory=free_port)
    tls: Tls | None = None
    users: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None

    def write_config(self) -> Path:
        lines = [f"listener {self.port} 127.0.0.1", "persistence true", f"persistence_location {self.folder}/",
                 "log_dest stderr", "log_type error", "log_type warning"]
        if os.geteuid() == 0:
            lines.append("user root")  # as root it would drop to user mosquitto, who cannot read the test's folder
        if self.users:
            pw = self.folder / "passwords"
            pw.write_text("")
            for user, password in self.users.items():
                subprocess.run([_tool("mosquitto_passwd"), "-b", str(pw), user, password], check=True)
            pw.chmod(0o600)
            lines += [f"password_file {pw}", "allow_anonymous false"]
        else:
            lines.append("allow_anonymous true")
        if self.tls is not None:
            lines += [f"cafile {self.tls.ca}", f"certfile {self.tls.server_cert}", f"keyfile {self.tls.server_key}",
                      "require_certificate true"]
        conf = self.folder / "mosquitto.conf"
        conf.write_text("\n".join(lines) + "\n")
        return conf

    def start(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        conf = self.write_config()
        self.proc = subprocess.Popen([_tool("mosquitto"), "-c", str(conf)], stderr=subprocess.PIPE)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), 0.2):
                return
            if self.proc.poll() is not None:
                raise RuntimeError(f"mosquitto exited: {self.proc.stderr.read().decode()[-500:]}")  # type: ignore
            time.sleep(0.05)
        raise RuntimeError("mosquitto did not listen within 10 s")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)
        self.proc = None

    def client_args(self) -> list[str]:
        args = ["-h", "127.0.0.1", "-p", str(self.port)]
        if self.tls is not None:
            args += ["--cafile", str(self.tls.ca), "--cert", str(self.tls.client_cert), "--key",
                     str(self.tls.client_key)]
        if self.users:
            user, password = next(iter(self.users.items()))
            args += ["-u", user, "-P", password]
        return args


@contextlib.contextmanager
def broker(folder: Path, tls: Tls | None = None, users: dict[str, str] | None = None) -> Iterator[Broker]:
    need_mosquitto()
    b = Broker(folder, tls=tls, users=users or {})
    b.start()
    try:
        yield b
    finally:
        b.stop()


@dataclass
class Received:
    topic: str
    retained: bool
    payload: bytes
    at: float


class Subscriber:
    """``mosquitto_sub`` on ``topics``, QoS 1, with a persistent session (``-c``, its own id): messages published
    while it (or the broker) was away reach it when it is back. Every message, in order, in ``messages``."""

    def __init__(self, b: Broker, topics: list[str], client_id: str = "edge-test-sub") -> None:
        self.broker = b
        self.topics = topics
        self.client_id = client_id
        self.messages: list[Received] = []
        self.proc: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()

    def start(self) -> Subscriber:
        args = [_tool("mosquitto_sub"), *self.broker.client_args(), "-q", "1", "-c", "-i", self.client_id,
                "-F", "%t\t%r\t%x"]
        for t in self.topics:
            args += ["-t", t]
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        threading.Thread(target=self._read, args=(self.proc,), daemon=True).start()
        time.sleep(0.3)  # its SUBSCRIBE reaches the broker
        return self

    def _read(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            topic, retained, hexed = line.decode().rstrip("\n").split("\t")
            with self._lock:
                self.messages.append(Received(topic, retained == "1", bytes.fromhex(hexed), time.monotonic()))

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(5)
            self.proc = None

    def on(self, topic: str) -> list[Received]:
        with self._lock:
            return [m for m in self.messages if m.topic == topic]

    def wait_for(self, topic: str, payload: bytes | None = None, timeout_s: float = 15.0) -> Received:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for m in self.on(topic):
                if payload is None or m.payload == payload:
                    return m
            time.sleep(0.05)
        seen = sorted({m.topic for m in self.messages})
        raise AssertionError(f"no {payload!r} on {topic} within {timeout_s} s; topics seen: {seen}")


def publish(b: Broker, topic: str, payload: str, retain: bool = False) -> None:
    args = [_tool("mosquitto_pub"), *b.client_args(), "-q", "1", "-t", topic, "-m", payload]
    subprocess.run(args + (["-r"] if retain else []), check=True, timeout=10)
