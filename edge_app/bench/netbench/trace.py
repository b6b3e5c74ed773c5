"""Network traces: a small CSV format for a schedule of delay, jitter, loss and rate.

One header row, then one row per change; a row's values hold until the next row's time::

    t_s,rtt_ms,jitter_ms,loss_pct,rate_kbit
    0,20,0,0,
    20,150,0,0,
    40,20,0,0,

``t_s``        seconds from the start of the replay (first row 0, increasing)
``rtt_ms``     round-trip delay added by the path, split evenly between the two directions, or
``delay_ms``   one-way delay added in each direction (give one of the two)
``jitter_ms``  optional: each packet gets an extra uniform 0..jitter_ms (packets may then reorder)
``loss_pct``   optional: independent loss per packet and direction, 0..100
``rate_kbit``  optional: tbf rate limit in kbit/s per direction; empty or 0: unlimited
``duration_s`` is the last row's time plus ``hold_s`` (a trace's end is its last change plus a tail).
Lines starting with ``#`` are comments.
"""

from __future__ import annotations

import bisect
import csv
import io
from dataclasses import dataclass
from pathlib import Path

from edge_app.errors import EdgeAppError

TRACES = Path(__file__).resolve().parent / "traces"


class TraceError(EdgeAppError, ValueError):
    """A trace file that cannot be used; the message names the file, row and column."""


@dataclass(frozen=True)
class Step:
    t_s: float
    one_way_ms: float  # added in each direction
    jitter_ms: float = 0.0
    loss_pct: float = 0.0
    rate_kbit: float | None = None

    @property
    def rtt_ms(self) -> float:
        return 2 * self.one_way_ms


@dataclass(frozen=True)
class Trace:
    name: str
    steps: tuple[Step, ...]
    hold_s: float = 20.0  # how long the last row lasts

    @property
    def duration_s(self) -> float:
        return self.steps[-1].t_s + self.hold_s

    def at(self, t_s: float) -> Step:
        """The step in force ``t_s`` seconds into the replay (the first before 0, the last after the end)."""
        i = bisect.bisect_right([s.t_s for s in self.steps], t_s) - 1
        return self.steps[max(i, 0)]

    def worsenings(self) -> list[float]:
        """Times at which the round trip rises (or loss appears, or the rate falls): the moments to watch."""
        out = []
        for a, b in zip(self.steps, self.steps[1:], strict=False):
            slower = b.one_way_ms + b.jitter_ms > a.one_way_ms + a.jitter_ms
            lossier = b.loss_pct > a.loss_pct
            narrower = b.rate_kbit is not None and (a.rate_kbit is None or b.rate_kbit < a.rate_kbit)
            if slower or lossier or narrower:
                out.append(b.t_s)
        return out

    def recoveries(self) -> list[float]:
        """Times at which the trace returns to its best round trip from a worse one."""
        best = min(s.rtt_ms for s in self.steps)
        return [b.t_s for a, b in zip(self.steps, self.steps[1:], strict=False)
                if b.rtt_ms <= best and a.rtt_ms > best]


def _number(text: str, where: str, lo: float, hi: float) -> float:
    try:
        v = float(text)
    except ValueError:
        raise TraceError(f"{where}: {text!r} is not a number") from None
    if not lo <= v <= hi:
        raise TraceError(f"{where}: {v:g} is outside {lo:g}..{hi:g}")
    return v


def parse_trace(text: str, name: str = "trace", hold_s: float | None = None) -> Trace:
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    if not lines:
        raise TraceError(f"{name}: empty trace (need a header row and at least one row)")
    reader = csv.DictReader(io.StringIO("\n".join(lines)))
    cols = [c.strip() for c in reader.fieldnames or []]
    reader.fieldnames = cols
    known = {"t_s", "rtt_ms", "delay_ms", "jitter_ms", "loss_pct", "rate_kbit"}
    if unknown := [c for c in cols if c not in known]:
        raise TraceError(f"{name}: unknown column(s) {unknown}; known: {sorted(known)}")
    if "t_s" not in cols or ("rtt_ms" in cols) == ("delay_ms" in cols):
        raise TraceError(f"{name}: the header needs t_s and exactly one of rtt_ms (round trip) or delay_ms (one way)")
    steps: list[Step] = []
    for row_no, row in enumerate(reader, start=2):
        where = f"{name} row {row_no}"
        get = {k: (v or "").strip() for k, v in row.items() if k is not None}
        if None in row:
            raise TraceError(f"{where}: more values than columns")
        t = _number(get["t_s"], f"{where} t_s", 0, 86_400)
        if steps and t <= steps[-1].t_s:
            raise TraceError(f"{where} t_s: times must increase ({t:g} after {steps[-1].t_s:g})")
        if not steps and t != 0:
            raise TraceError(f"{where} t_s: the first row must be at 0")
        one_way = (_number(get["rtt_ms"], f"{where} rtt_ms", 0, 10_000) / 2 if "rtt_ms" in get
                   else _number(get["delay_ms"], f"{where} delay_ms", 0, 5_000))
        jitter = _number(get["jitter_ms"], f"{where} jitter_ms", 0, 5_000) if get.get("jitter_ms") else 0.0
        loss = _number(get["loss_pct"], f"{where} loss_pct", 0, 100) if get.get("loss_pct") else 0.0
        rate = _number(get["rate_kbit"], f"{where} rate_kbit", 0, 10_000_000) if get.get("rate_kbit") else 0.0
        steps.append(Step(t, one_way, jitter, loss, rate or None))
    if not steps:
        raise TraceError(f"{name}: no rows after the header")
    return Trace(name, tuple(steps), hold_s if hold_s is not None else 20.0)


def load_trace(path: Path | str, hold_s: float | None = None) -> Trace:
    """Read a trace file; a bare name (``step``) means one of the shipped traces."""
    p = Path(path)
    if not p.exists() and (TRACES / f"{p.name}.csv").exists():
        p = TRACES / f"{p.name}.csv"
    if not p.exists():
        shipped = ", ".join(sorted(q.stem for q in TRACES.glob("*.csv")))
        raise TraceError(f"{path}: no such trace file (shipped traces: {shipped})")
    text = p.read_text()
    hold = hold_s
    for ln in text.splitlines():  # "# hold_s: 20" in a comment sets the tail
        if ln.lstrip().startswith("#") and "hold_s:" in ln and hold is None:
            hold = _number(ln.split("hold_s:", 1)[1].strip(), f"{p} hold_s comment", 0, 86_400)
    return parse_trace(text, str(p), hold)
