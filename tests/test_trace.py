"""The trace CSV format: parsing, errors that name the row and column, lookup, the shipped traces."""

from __future__ import annotations

from pathlib import Path

import pytest

from edge_app.bench.netbench.trace import TRACES, TraceError, load_trace, parse_trace


def test_rows_hold_until_the_next_and_rtt_is_split_per_direction() -> None:
    tr = parse_trace("t_s,rtt_ms,jitter_ms,loss_pct,rate_kbit\n0,20,0,0,\n10,150,5,1,800\n20,20,,,\n", hold_s=5)
    assert tr.duration_s == 25
    assert tr.at(-1).one_way_ms == 10 and tr.at(9.99).one_way_ms == 10
    s = tr.at(10)
    assert (s.one_way_ms, s.rtt_ms, s.jitter_ms, s.loss_pct, s.rate_kbit) == (75, 150, 5, 1, 800)
    assert tr.at(100).rate_kbit is None and tr.at(100).loss_pct == 0
    assert tr.worsenings() == [10]


def test_one_way_delay_column_and_comments() -> None:
    tr = parse_trace("# a comment\nt_s,delay_ms\n0,5\n\n3,40\n")
    assert [s.one_way_ms for s in tr.steps] == [5, 40] and tr.worsenings() == [3]


@pytest.mark.parametrize(("text", "message"), [
    ("", "empty trace"),
    ("t_s,rtt_ms,bogus\n0,1,2\n", "unknown column"),
    ("t_s,rtt_ms,delay_ms\n0,1,2\n", "exactly one of rtt_ms"),
    ("t_s,rtt_ms\n1,20\n", "row 2 t_s: the first row must be at 0"),
    ("t_s,rtt_ms\n0,20\n5,x\n", "row 3 rtt_ms: 'x' is not a number"),
    ("t_s,rtt_ms\n0,20\n5,30\n5,40\n", "row 4 t_s: times must increase"),
    ("t_s,rtt_ms,loss_pct\n0,20,150\n", "row 2 loss_pct: 150 is outside 0..100"),
    ("t_s,rtt_ms\n0,20,7\n", "more values than columns"),
    ("t_s,rtt_ms\n", "no rows"),
])
def test_bad_traces_name_the_row_and_column(text: str, message: str) -> None:
    with pytest.raises(TraceError, match=message):
        parse_trace(text, "x.csv")


def test_shipped_traces_load_by_name(tmp_path: Path) -> None:
    names = sorted(p.stem for p in TRACES.glob("*.csv"))
    assert {"steady", "step", "bursty", "bursty-lossy", "drift", "short-step"} <= set(names)
    step = load_trace("step")
    assert [s.rtt_ms for s in step.steps] == [20, 150, 20] and step.duration_s == 60
    assert load_trace("bursty").worsenings() == [10, 20, 30, 40]
    bursty, lossy = load_trace("bursty"), load_trace("bursty-lossy")
    assert [s.rtt_ms for s in bursty.steps] == [s.rtt_ms for s in lossy.steps]
    assert max(s.loss_pct for s in bursty.steps) == 0 and max(s.loss_pct for s in lossy.steps) == 2
    with pytest.raises(TraceError, match=r"no such trace file.*shipped traces: bursty"):
        load_trace(tmp_path / "missing.csv")


def test_unavoidable_misses_are_frames_that_reached_the_server_too_late() -> None:
    from edge_app.bench.netbench.report import FrameRecord, misses_text, unavoidable

    def frame(to_server: float, server: float, compute: float, runs: int, downlink: float = 100.0) -> FrameRecord:
        to_result = to_server + server + downlink
        return FrameRecord(0.0, 0, 200.0, 200.0, False, 0.0, 1, runs, 3, compute, 1, 1, 1, to_result, None,
                           to_server, server, to_result <= 300.0)

    frames = [
        frame(140.0, 40.0, 25.0, 1),  # on time
        frame(140.0, 90.0, 75.0, 3),  # late, but exit 1 at once (25 ms) would have made it: the policy's miss
        frame(180.0, 30.0, 25.0, 1),  # 180 + 25 + 100 > 300: late whatever ran
        frame(250.0, 30.0, 25.0, 1),  # held behind a retransmission
        frame(185.0, 10.0, 10.0, 1),  # on time (a quick exit 1) though the median exit 1 would not be
    ]
    assert [f.to_server_ms for f in unavoidable(frames, 300.0)] == [180.0, 250.0]
    listed = misses_text(frames, load_trace("step"), 300.0).splitlines()
    assert [line.split()[-1] for line in listed[-3:]] == ["no", "yes", "yes"], "one line per miss"
    # the exit-1 cost is this run's own median over frames that ran exit 1 alone
    assert unavoidable([frame(170.0, 45.0, 40.0, 1)], 300.0) != []
    assert unavoidable([frame(170.0, 45.0, 20.0, 1)], 300.0) == []


def test_the_bench_waits_for_the_app_to_listen_and_quotes_a_failed_start(tmp_path: Path) -> None:
    import subprocess
    import sys

    from edge_app.bench.netbench.bench import wait_listening

    log = tmp_path / "app.log"
    code = "import time; time.sleep(0.5); print('INFO serving on http://127.0.0.1:1/', flush=True); time.sleep(5)"
    with log.open("wb") as f:
        ok = subprocess.Popen([sys.executable, "-c", code], stdout=f, stderr=subprocess.STDOUT)
    try:
        wait_listening(ok, log, timeout_s=20)
        assert ok.poll() is None, "returned while the app runs, once it listens"
    finally:
        ok.kill()
        ok.wait()
    with log.open("wb") as f:
        bad = subprocess.Popen([sys.executable, "-c", "import sys; print('error: config.toml: bad key'); sys.exit(2)"],
                               stdout=f, stderr=subprocess.STDOUT)
    with pytest.raises(RuntimeError, match=r"(?s)exited with 2.*bad key"):
        wait_listening(bad, log, timeout_s=20)


def test_good_network_accuracy_is_split_at_each_recovery() -> None:
    from edge_app.bench.netbench.report import RECOVERY_S, FrameRecord, recovery_table, summarise

    step = load_trace("step")  # 20 ms, 150 ms from 20 s, 20 ms again from 40 s
    assert step.recoveries() == [40] and load_trace("bursty").recoveries() == [13, 22, 34, 43]

    def frame(t: float, rtt: float, right: bool, runs: int) -> FrameRecord:
        return FrameRecord(t, 0, rtt, rtt, False, 100.0, max(runs, 1), runs, 3, 25.0, 1, 1 if right else 2, 1,
                           150.0, None, 50.0, 40.0, True)

    frames = [frame(5.0, 20, True, 3), frame(10.0, 20, True, 3),  # settled, before the step
              frame(30.0, 150, False, 1),  # bad: in neither
              frame(40.5, 20, False, 1), frame(40.0 + RECOVERY_S - 0.1, 20, True, 0),  # just after it came back
              frame(40.0 + RECOVERY_S + 0.1, 20, True, 2)]  # settled again
    s = summarise(frames, {"unanswered": 0}, step, 300.0)
    assert s["frames_recovering"] == 2 and s["accuracy_recovering"] == 0.5 and s["reused_recovering"] == 1
    assert s["accuracy_settled"] == 1.0 and s["mean_exits_run_settled"] == pytest.approx(8 / 3)
    assert s["accuracy_good"] == pytest.approx(4 / 5)
    row = recovery_table({"ours": s}).splitlines()[-1]
    assert row == "| ours | 2 | 50.0 | 0.50 | 1 | – | 100.0 | 2.67 | – |"  # heights not recorded: –


def test_stage_latency_is_also_given_per_phase() -> None:
    from edge_app.bench.netbench.report import FrameRecord, latency_table, summarise

    step = load_trace("step")

    def frame(t: float, rtt: float, to_server: float) -> FrameRecord:
        return FrameRecord(t, 0, rtt, rtt, False, 100.0, 1, 1, 3, 25.0, 1, 1, 1, to_server + 60.0, None,
                           to_server, 30.0, True)

    # a policy that analyses more frames while the path is slow: its overall median comes from the bad phase
    frames = [frame(5.0 + i, 20, 47.0) for i in range(2)] + [frame(25.0 + i, 150, 112.0) for i in range(3)]
    s = summarise(frames, {"unanswered": 0}, step, 300.0)
    assert s["to_server_p50_ms"] == 112.0
    assert (s["to_server_p50_good_ms"], s["to_server_p50_bad_ms"]) == (47.0, 112.0)
    assert s["server_p50_good_ms"] == s["server_p50_bad_ms"] == 30.0
    row = latency_table({"greedy": {**s, "session_start_ms": None}}).splitlines()[-1]
    assert row.startswith("| greedy | 112 (47 / 112) | 30 (30 / 30) |")
