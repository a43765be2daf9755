"""Long commands with their output a pipe or a file (cron, nohup, CI): progress arrives as plain, flushed lines while
the work goes on (`rlhfops.console.progress`), each saying done/total, not as one bar drawn when the command ends."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
import time
from types import SimpleNamespace

import pandas as pd

STAMP = re.compile(r"^\[\s*(\d+\.\d) s\] (.*)$")


def test_simulate_into_a_pipe_prints_done_total_lines_as_the_work_goes_on(tmp_path):
    """`rlhfops simulate E7` (5 variants x 3 seeds, small) read from a pipe line by line as it arrives: a start line
    (0/15), lines at every tenth with growing counts, a done line (15/15), all before the result table, and each
    read when the process wrote it (the gaps between reads follow the lines' own time stamps: a buffered or end-drawn
    display would deliver them all at once). The total is checked against the (variant, seed) pairs in
    per_seed.csv."""
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "MPLBACKEND": "Agg"}
    out = tmp_path / "e7"
    proc = subprocess.Popen([sys.executable, "-m", "rlhfops.cli", "simulate", "E7", "--seeds", "42,43,44", "--jobs",
                             "120", "--workers", "1", "--out", str(out)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    lines: list[tuple[float, bool, str]] = []  # (read at, process still running, line)
    try:
        for line in proc.stdout:
            lines.append((time.monotonic(), proc.poll() is None, line.rstrip("\n")))
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, proc.stderr.read()
    per_seed = pd.read_csv(out / "per_seed.csv")
    total = len(per_seed[["variant", "seed"]].drop_duplicates())
    assert total == 15

    stamped = [(read, running, float(m[1]), m[2]) for read, running, text in lines if (m := STAMP.match(text))]
    texts = [t for *_, t in stamped]
    name = "E7: variant x seed"
    assert texts[0] == f"stage 1: {name} (0/{total})"
    counts = [int(m[1]) for t in texts[1:-1] if (m := re.fullmatch(rf"  {re.escape(name)}: (\d+)/{total}", t))]
    assert len(counts) == len(texts) - 2 and counts == sorted(set(counts)) and 0 < counts[0] and counts[-1] < total
    assert len(counts) >= 5  # every tenth of 15 items: 2, 4, ..., 14
    assert re.fullmatch(rf"  done: {re.escape(name)} \({total}/{total}\) in \d+\.\d s", texts[-1])
    table_at = next(i for i, (_r, _a, text) in enumerate(lines) if text.startswith("E7:"))
    assert table_at == len(stamped)  # every progress line came before the table
    # as it happened: between the first count line and the done line the reader waited about as long as the command
    # says it worked (a display drawn at the end, or lines left in a buffer, would arrive together)
    (read1, running1, stamp1, _), (read2, _running2, stamp2, _) = stamped[1], stamped[-1]
    assert running1 and stamp2 - stamp1 > 0.2, stamped
    assert read2 - read1 > 0.5 * (stamp2 - stamp1), stamped


def _piped_console():
    from rich.console import Console

    buf = io.StringIO()
    return Console(file=buf, width=200), buf


def _unstamped(buf: io.StringIO) -> list[str]:
    out = []
    for line in buf.getvalue().splitlines():
        m = STAMP.match(line)
        out.append(m[2] if m else line)
    return out


def test_a_count_reported_so_far_gives_every_tenth_and_a_done_line():
    """`bench oppo`'s callback reports steps done so far (not increments): counts that repeat or jump still give
    one line per tenth crossed and a done line with done/total."""
    from rlhfops.console import progress

    console, buf = _piped_console()
    with progress(console, "steps", total=30) as shown:
        for done in (1, 2, 3, 3, 4, 9, 10, 13, 30):
            shown.update(done)
    # a tenth of 30 is 3: lines where done // 3 grows (3, 9, 13), none at 30 (the done line says it)
    assert _unstamped(buf) == ["stage 1: steps (0/30)", "  steps: 3/30", "  steps: 9/30", "  steps: 13/30",
                               f"  done: steps (30/30) in {_done_secs(buf)} s"]


def _done_secs(buf: io.StringIO) -> str:
    return re.search(r"in (\d+\.\d) s$", buf.getvalue().splitlines()[-1])[1]


def test_sweep_events_into_a_pipe_count_finished_trials():
    """The sweep display (also `bench sweep`'s): started before the display is entered, as `bench sweep` does; one
    line per finished trial from the sweep itself, and the trial count every tenth of the target."""
    from rlhfops.commands.sweep import progress_events

    console, buf = _piped_console()
    shown, on_event, begin = progress_events(console)
    begin("demo", 0, 4)
    with shown:
        for n in range(4):
            on_event("trial_started", {})
            on_event("trial_finished", {"result": SimpleNamespace(number=n, state="pruned" if n % 2 else "complete",
                                                                  pruned_at=3 if n % 2 else None, objective=0.5,
                                                                  gpu_seconds=1.0, error=None)})
    lines = _unstamped(buf)
    assert lines[0] == "stage 1: sweep demo: trials (0/4)"
    assert [ln for ln in lines if ln.startswith("  sweep demo")] == [f"  sweep demo: trials: {k}/4" for k in (1, 2, 3)]
    assert lines[-1] == f"  done: sweep demo: trials (4/4) in {_done_secs(buf)} s"
    assert sum(ln.startswith("trial ") for ln in lines) == 4


def test_a_terminal_gets_a_bar_not_lines():
    """The other side of the switch: on a terminal the same calls draw a rich bar (done/total in it), no plain
    stamped lines."""
    from rich.console import Console

    from rlhfops.console import progress

    buf = io.StringIO()
    console = Console(file=buf, width=120, force_terminal=True)
    with progress(console, "steps", total=30) as shown:
        shown.update(12)
        shown.status("running 2")
    text = buf.getvalue()
    assert "12/30" in text and "steps  running 2" in text
    assert not any(STAMP.match(line) for line in text.splitlines())


def test_canary_into_a_pipe_prints_a_stage_per_canary_with_its_steps(monkeypatch):
    """`rlhfops canary` off a terminal (it ran a spinner that printed nothing into a pipe): one stage per canary
    (0/steps), count lines as the run reports its steps, a done line with steps/steps, before the table. The run
    itself is replaced by one that reports each step it "trains" (the command's wiring is what is tested here; the
    canaries' training has its own tests)."""
    from typer.testing import CliRunner

    import rlhfops.commands.canary as canary_cmd
    from rlhfops.cli import app

    reported: dict[str, list[int]] = {}

    def fake_run(canary, steps, fault_at, cache_dir, catalog, metrics, ledger, progress):
        reported[canary.name] = []
        for step in range(1, steps + 1):
            reported[canary.name].append(step)
            progress(step)
        return {"canary": canary.name, "expected": "-", "fired_at": float("nan"), "paged": [], "states": [],
                "state": "SUCCEEDED", "reason": "", "steps_run": steps, "wall_s": 0.0, "ok": True, "error": None}

    monkeypatch.setattr(canary_cmd, "run_canary", fake_run)
    res = CliRunner().invoke(app, ["canary", "--only", "control,frozen_sync", "--steps", "20", "--fault-at", "4"])
    assert res.exit_code == 0, res.output
    assert reported == {"control": list(range(1, 21)), "frozen_sync": list(range(1, 21))}
    texts = [m[2] for line in res.output.splitlines() if (m := STAMP.match(line))]
    for i, name in enumerate(("control", "frozen_sync"), start=1):
        stage = f"canary {name} (fault at step 4)"
        assert f"stage {i}: {stage} (0/20)" in texts
        counts = [int(m[1]) for t in texts if (m := re.fullmatch(rf"  {re.escape(stage)}: (\d+)/20", t))]
        assert counts == [2, 4, 6, 8, 10, 12, 14, 16, 18]
        assert any(re.fullmatch(rf"  done: {re.escape(stage)} \(20/20\) in \d+\.\d s", t) for t in texts)
    assert res.output.index("done: canary frozen_sync") < res.output.index("rlhfops canary")
