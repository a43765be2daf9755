"""`rlhfops nightly` as a new user runs it: from a directory that is not the repository, with its output a pipe
(cron, nohup, CI). Every default config path resolves (the sweep spec's included), every input is checked before the
Prefect server starts, a progress line appears per stage while the run goes on, and the closing hints name the
servers the run used."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from flows.progress import LineReporter

RLHFOPS = [sys.executable, "-m", "rlhfops.cli"]


def _clean_env(tmp_path) -> dict[str, str]:
    """No configured servers (the temporary Prefect server, a SQLite MLflow store in the working directory) and a
    Prefect home of its own."""
    env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", "MLFLOW_TRACKING_URI")}
    env.update(PREFECT_HOME=str(tmp_path / "prefect-home"), PREFECT_SERVER_ANALYTICS_ENABLED="false",
               OMP_WAIT_POLICY="PASSIVE", MPLBACKEND="Agg")
    return env


@pytest.mark.slow
def test_nightly_quick_from_a_temporary_directory_prints_progress_into_a_pipe(tmp_path):
    """The simulation matrix (E1, one seed) and the report: the stage lines arrive while the process still runs
    (read from the pipe as they come), the outputs land under the working directory, and the hints name the
    temporary server and the SQLite store actually used."""
    work = tmp_path / "anywhere"
    work.mkdir()
    proc = subprocess.Popen([*RLHFOPS, "nightly", "--quick", "--stages", "matrix", "--experiments", "E1",
                             "--seeds", "42", "--workers", "1"], cwd=work, env=_clean_env(tmp_path),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines, running_at = [], {}
    t0 = time.monotonic()
    try:
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            running_at[len(lines) - 1] = proc.poll() is None
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    stderr = proc.stderr.read()
    wall = time.monotonic() - t0
    assert proc.returncode == 0, (lines, stderr)
    print(f"nightly --quick --stages matrix from {work}: {wall:.1f} s")

    def first(text: str) -> int:
        found = [i for i, ln in enumerate(lines) if text in ln]
        assert found, (text, lines)
        return found[0]

    start = first("stage 1: simulation matrix: variant x seed (0/1)")
    done = first("done: simulation matrix: variant x seed (1/1)")
    report = first("stage 2: report: tonight vs the last nightly")
    assert start < done < report
    # written as they happened, not when the command ended: the process was still running when each arrived
    assert running_at[start] and running_at[done] and running_at[report]
    assert (work / "results" / "nightly" / "scheduling" / "E1" / "tenants.csv").is_file()
    assert (work / "results" / "nightly" / "report.md").is_file()
    assert (work / "mlflow.db").is_file()
    hints = "\n".join(lines[first("Where to look:"):])
    assert f"--backend-store-uri sqlite:///{work / 'mlflow.db'}" in hints
    assert "this run used a temporary server" in hints


def test_every_default_input_is_checked_from_another_directory(tmp_path, monkeypatch):
    """From a directory with no configs/: the quick nightly's defaults (the sweep spec configs/sweeps/example.yaml,
    its base job config, the RLHF job) all resolve to the shipped configs and pass the checks, without torch."""
    import subprocess

    probe = ("import sys\nfrom flows.nightly_check import check_nightly\np = check_nightly(quick=True)\n"
             "print(p.experiments[0], p.sweep_trials, p.job.out_dir, 'torch' in sys.modules)\n")
    r = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["E1", "2", "results/nightly/rlhf-job", "False"]


@pytest.mark.parametrize("args, needle", [
    (["--sweep-spec", "configs/sweeps/nope.yaml"], "sweep_spec: file 'configs/sweeps/nope.yaml' not found"),
    (["--sweep-spec", "empty.yaml"], "'empty.yaml' is empty"),
    (["--stages", "matrix,sim"], "--stages: 'sim' is not a stage"),
    (["--job-steps", "2"], "job_steps: 2 must be a whole number >= 4"),
])
def test_a_bad_nightly_input_exits_2_before_the_server_starts(tmp_path, args, needle):
    """One line, exit 2, within seconds, and nothing written: no server start, no MLflow store, no results/."""
    (tmp_path / "empty.yaml").write_text("")
    t0 = time.monotonic()
    r = subprocess.run([*RLHFOPS, "nightly", "--quick", *args], cwd=tmp_path, env=_clean_env(tmp_path),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = [ln for ln in r.stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and needle in lines[0], r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty.yaml"]
    assert time.monotonic() - t0 < 60  # the temporary server alone takes 10-18 s to start; nothing got that far


def test_line_reporter_against_hand_written_lines():
    """A stage of 20 items prints at every tenth (2, 4, ...), not at the last item (the done line says it); a stage
    without a total every 10 items; `close` ends the open stage. Times from a fake clock."""
    now = [100.0]
    out: list[str] = []
    rep = LineReporter(out.append, clock=lambda: now[0])
    now[0] = 101.0
    rep.stage("matrix", total=20)
    for _ in range(20):
        now[0] += 0.5
        rep.advance()
    rep.stage("sweep")
    for _ in range(25):
        rep.advance()
    rep.note("hello")
    rep.close()
    rep.close()  # nothing open: no line
    assert out == [
        "[    1.0 s] stage 1: matrix (0/20)",
        *[f"[{1.0 + 0.5 * k:7.1f} s]   matrix: {k}/20" for k in range(2, 20, 2)],
        "[   11.0 s]   done: matrix (20/20) in 10.0 s",
        "[   11.0 s] stage 2: sweep",
        "[   11.0 s]   sweep: 10",
        "[   11.0 s]   sweep: 20",
        "[   11.0 s] hello",
        "[   11.0 s]   done: sweep (25) in 0.0 s",
    ]


def test_the_hints_name_the_servers_used():
    from rlhfops.commands.nightly import server_hints

    mlflow, prefect = server_hints("http://mlflow.internal:5000", "http://prefect.internal:4200/api")
    assert mlflow == "MLflow UI   http://mlflow.internal:5000"
    assert prefect == "Prefect UI  http://prefect.internal:4200   (API http://prefect.internal:4200/api)"
    assert "4200" not in " ".join(server_hints("http://mlflow.internal:5000", "http://10.0.0.7:8080/api"))
    mlflow, prefect = server_hints("sqlite:////srv/m.db", None)
    assert mlflow.endswith("mlflow ui --backend-store-uri sqlite:////srv/m.db   (store: /srv/m.db)")
    assert "temporary server" in prefect
