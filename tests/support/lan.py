"""A small LAN of network namespaces for multi-box tests: one namespace holds a bridge, every other one is a host
on it (``10.78.0.2``, ``.3``, ...), IPv6 off. Root, ``ip`` (iproute2). Names carry this process's id, so
``netns.remove_stale`` clears what a killed run left; everything run inside is killed and removed on exit."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator

from edge_app.bench.netbench import netns

SUBNET = "10.78.0"


@contextlib.contextmanager
def lan(hosts: list[str]) -> Iterator[dict[str, tuple[str, str]]]:
    """``{host: (namespace, address)}`` for each of ``hosts``."""
    netns.check_available()
    netns.remove_stale()
    tag = str(os.getpid())
    bridge_ns = f"{netns.PREFIX}lan-{tag}"
    made: list[str] = []
    out: dict[str, tuple[str, str]] = {}

    def run(*cmd: str) -> None:
        subprocess.run(cmd, check=True, capture_output=True, text=True)

    try:
        for i, name in enumerate(["lan", *hosts]):
            ns = bridge_ns if name == "lan" else f"{netns.PREFIX}{name}-{tag}"
            run("ip", "netns", "add", ns)
            made.append(ns)
            run("ip", "netns", "exec", ns, "sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1",
                "net.ipv6.conf.default.disable_ipv6=1")
            run("ip", "-n", ns, "link", "set", "lo", "up")
            if name == "lan":
                run("ip", "-n", ns, "link", "add", "br0", "type", "bridge")
                run("ip", "-n", ns, "link", "set", "br0", "up")
                continue
            run("ip", "-n", ns, "link", "add", "eth0", "type", "veth", "peer", "name", f"p{i}", "netns", bridge_ns)
            run("ip", "-n", bridge_ns, "link", "set", f"p{i}", "master", "br0", "up")
            addr = f"{SUBNET}.{i + 1}"
            run("ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", "eth0")
            run("ip", "-n", ns, "link", "set", "eth0", "up")
            out[name] = (ns, addr)
        yield out
    finally:
        for ns in reversed(made):
            netns._kill_and_delete(ns)


def in_ns(ns: str, *cmd: str) -> list[str]:
    return ["ip", "netns", "exec", ns, *cmd]


def fetch(ns: str, url: str, timeout_s: float = 5.0) -> str:
    """GET ``url`` from inside ``ns`` (Python's urllib, in a child process there); '' when it cannot."""
    code = ("import sys, urllib.request\n"
            "try:\n"
            f"    print(urllib.request.urlopen(sys.argv[1], timeout={timeout_s}).read().decode())\n"
            "except OSError:\n"
            "    pass\n")
    r = subprocess.run(in_ns(ns, sys.executable, "-c", code, url), capture_output=True, text=True,
                       timeout=timeout_s + 10)
    return r.stdout
