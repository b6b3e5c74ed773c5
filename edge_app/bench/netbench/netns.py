"""Three network namespaces joined through a middle one that impairs the path.

    [app ns] veth0 10.77.0.1/24 <-> to-app [mid ns: bridge] to-cli <-> veth0 10.77.0.2/24 [cli ns]

The middle namespace has no addresses; the bridge (``edge_app.bench.netbench.bridge``) forwards frames
between its two interfaces.  IPv6 is off everywhere (no stray router solicitations), offloads are off
on every veth (frames stay MTU-sized, as on a wire, so delay and tbf act per packet).  Names carry the
creating process id, so parallel runs do not collide; ``remove_stale`` deletes namespaces left by a
run that was killed.  Needs root, ``ip`` (iproute2) and ``ethtool``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass

from edge_app.errors import EdgeAppError

log = logging.getLogger(__name__)

PREFIX = "edgeapp-"
APP_ADDR = "10.77.0.1"
CLI_ADDR = "10.77.0.2"
MID_TO_APP = "to-app"
MID_TO_CLI = "to-cli"


class NetnsUnavailable(EdgeAppError, RuntimeError):
    """Namespaces cannot be made here (not root, or a tool is missing)."""


def _run(*cmd: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({r.returncode}): {r.stderr.strip()}")
    return r


def check_available() -> None:
    if os.geteuid() != 0:
        raise NetnsUnavailable("network namespaces need root")
    for tool in ("ip", "tc", "ethtool"):
        if shutil.which(tool) is None:
            raise NetnsUnavailable(f"{tool} is not installed (apt-get install iproute2 ethtool)")


@dataclass(frozen=True)
class Namespaces:
    app: str
    mid: str
    cli: str


def _offloads_off(ns: str, dev: str) -> None:
    for feature in ("tso", "gso", "gro", "tx", "rx", "sg"):  # one at a time: a veth may lack one of them
        _run("ip", "netns", "exec", ns, "ethtool", "-K", dev, feature, "off", check=False)


def _kill_and_delete(ns: str) -> None:
    r = _run("ip", "netns", "pids", ns, check=False)
    for pid in r.stdout.split():
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), 9)
    _run("ip", "netns", "del", ns, check=False)


def remove_stale() -> list[str]:
    """Delete namespaces of this harness whose creating process is gone; returns their names."""
    out = _run("ip", "netns", "list", check=False).stdout.split("\n")
    gone = []
    for line in out:
        name = line.split(" ")[0]
        if not name.startswith(PREFIX):
            continue
        pid = name.rsplit("-", 1)[-1]
        if pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
            _kill_and_delete(name)
            gone.append(name)
    return gone


@contextlib.contextmanager
def namespaces(tag: str | None = None) -> Iterator[Namespaces]:
    """Create the three namespaces and their links; delete them (and kill what runs in them) on exit."""
    check_available()
    for name in remove_stale():
        log.warning("removed a stale namespace %s", name)
    tag = tag or str(os.getpid())
    ns = Namespaces(f"{PREFIX}app-{tag}", f"{PREFIX}mid-{tag}", f"{PREFIX}cli-{tag}")
    made: list[str] = []
    try:
        for n in (ns.app, ns.mid, ns.cli):
            _run("ip", "netns", "add", n)
            made.append(n)
            _run("ip", "netns", "exec", n, "sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1",
                 "net.ipv6.conf.default.disable_ipv6=1")
            _run("ip", "-n", n, "link", "set", "lo", "up")
        _run("ip", "-n", ns.app, "link", "add", "veth0", "type", "veth", "peer", "name", MID_TO_APP, "netns", ns.mid)
        _run("ip", "-n", ns.cli, "link", "add", "veth0", "type", "veth", "peer", "name", MID_TO_CLI, "netns", ns.mid)
        for n, dev in ((ns.app, "veth0"), (ns.cli, "veth0"), (ns.mid, MID_TO_APP), (ns.mid, MID_TO_CLI)):
            _offloads_off(n, dev)
        _run("ip", "-n", ns.app, "addr", "add", f"{APP_ADDR}/24", "dev", "veth0")
        _run("ip", "-n", ns.cli, "addr", "add", f"{CLI_ADDR}/24", "dev", "veth0")
        for dev in (MID_TO_APP, MID_TO_CLI):
            _run("ip", "-n", ns.mid, "link", "set", dev, "promisc", "on", "up")
        _run("ip", "-n", ns.app, "link", "set", "veth0", "up")
        _run("ip", "-n", ns.cli, "link", "set", "veth0", "up")
        log.info("namespaces %s, %s, %s ready (%s <-> %s)", ns.app, ns.mid, ns.cli, APP_ADDR, CLI_ADDR)
        yield ns
    finally:
        for n in reversed(made):
            _kill_and_delete(n)
        log.info("namespaces %s removed", ", ".join(made))
