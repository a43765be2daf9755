"""`rlhfops bench cli`: how long the CLI takes to start, as a user sees it (wall time of a fresh process).

Each figure runs the installed console script `runs` times in a fresh process from a scratch directory, one
after the other; the JSON keeps every run, the median (`help_s`, `simulate_e1_s`), the best (`*_best_s`) and the median
CPU seconds of the process and its workers (`*_cpu_s`, less sensitive to other load on a shared machine). `simulate E1`
is the experiment with its default seeds and workers, writing into the scratch directory; `python_startup_s`
(`python -c pass`) is the floor no CLI change can go below."""

from __future__ import annotations

from pathlib import Path

import typer


def _command() -> list[str]:
    import sys

    script = Path(sys.executable).parent / "rlhfops"
    return [str(script)] if script.is_file() else [sys.executable, "-m", "rlhfops.cli"]


def _times(cmd: list[str], runs: int, cwd: Path, progress=None) -> tuple[list[float], list[float]]:
    """Wall and CPU (user + system, the process and its workers) seconds of each run; `progress` (a
    `rlhfops.console.Progress`) advanced after each."""
    import resource
    import subprocess
    import time

    walls, cpus = [], []
    for _ in range(runs):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
        walls.append(time.perf_counter() - t0)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} exited {done.returncode}: {done.stderr.strip()[-500:]}")
        if progress is not None:
            progress.advance()
    return walls, cpus


def bench_cli(runs: int, progress=None) -> dict:
    import os
    import platform
    import statistics
    import sys
    import tempfile

    with tempfile.TemporaryDirectory(prefix="rlhfops-bench-cli-") as tmp:
        cwd = Path(tmp)
        commands = {"python_startup": [sys.executable, "-c", "pass"], "help": [*_command(), "--help"],
                    "simulate_e1": [*_command(), "simulate", "E1", "--out", str(cwd / "e1")]}
        figures = {}
        for name, cmd in commands.items():
            if progress is not None:
                progress.stage(f"{name}: fresh processes", runs)
            figures[name] = _times(cmd, runs, cwd, progress)
    result: dict = {"runs": runs, "command": _command()}
    for name, (walls, cpus) in figures.items():
        result[f"{name}_s"] = statistics.median(walls)
        result[f"{name}_best_s"] = min(walls)
        result[f"{name}_runs_s"] = walls
        # CPU seconds are less sensitive than wall time to other load on a shared machine
        result[f"{name}_cpu_s"] = statistics.median(cpus)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    result.update(load_average_1min=load, cpus=os.cpu_count(), python=platform.python_version(),
                  machine=platform.machine())
    return result


def register_bench(bench_app: typer.Typer) -> None:
    @bench_app.command("cli")
    def bench_cli_cmd(
        runs: int = typer.Option(5, "--runs", help="fresh processes per figure (the JSON keeps the median)"),
        out: Path = typer.Option(None, "--out", help="write the JSON here"),
    ) -> None:
        """CLI start-up: wall time of `rlhfops --help` and `rlhfops simulate E1` in fresh processes."""
        from common.errors import BadInput
        from common.validate import check_out_file
        from rlhfops.commands.bench import write_json
        from rlhfops.console import make_console, progress

        if runs < 1:
            raise BadInput(f"runs: {runs} must be >= 1")
        check_out_file(out, "out")
        console = make_console()
        with progress(console, transient=True) as shown:
            result = bench_cli(runs, shown)
        for name in ("python_startup", "help", "simulate_e1"):
            walls = ", ".join(f"{w:.2f}" for w in result[f"{name}_runs_s"])
            console.print(f"{name:>15}: median {result[f'{name}_s']:.2f}s, best {result[f'{name}_best_s']:.2f}s "
                          f"({walls}); CPU {result[f'{name}_cpu_s']:.2f}s")
        console.print(f"load average (1 min) after: {result['load_average_1min']:.2f} on {result['cpus']} CPUs")
        write_json(result, out)
