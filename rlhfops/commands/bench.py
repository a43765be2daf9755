"""`rlhfops bench ...`: benchmarks that write every figure to JSON. `bench sim` lives here; other areas
add theirs from their own modules (listed in BENCH_MODULES, each defining `register_bench(bench_app)`)."""

from __future__ import annotations

import importlib
import json
import multiprocessing as mp
import platform
from pathlib import Path

import typer

BENCH_MODULES: list[str] = ["bench_health", "bench_oppo", "bench_sweep", "bench_platform", "bench_gain",
                            "bench_sandbox", "bench_ranks"]

bench_app = typer.Typer(help="Benchmarks; each writes a JSON with every figure measured.", no_args_is_help=True)


def write_json(result: dict, out: Path | None) -> None:
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2) + "\n")


def _large_in_child(jobs: int, gpus: int, load: float, coalesce: bool, queue) -> None:
    # A fresh process so peak RSS is the large run's own, not the matrix's or the CLI's.
    from scheduling.bench import bench_large

    queue.put(bench_large(jobs, gpus, load, coalesce=coalesce))


def _run_in_child(shown, label: str, *args) -> dict:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    shown.stage(label)
    proc = ctx.Process(target=_large_in_child, args=(*args, queue))
    proc.start()
    result = queue.get()
    proc.join()
    return result


@bench_app.command("sim")
def bench_sim(
    quick: bool = typer.Option(False, "--quick", help="1 seed for the matrix and 100,000 jobs on 1,638 GPUs"),
    jobs: int = typer.Option(1_000_000, "--jobs", help="jobs in the large run"),
    gpus: int = typer.Option(16_384, "--gpus", help="GPUs in the large run"),
    load: float = typer.Option(0.95, "--load", help="offered load of the large run (GPU-minutes per minute / GPUs)"),
    out: Path = typer.Option(None, "--out", help="write the JSON here"),
) -> None:
    """E1-E8 x 5 seeds wall time, then one large run: wall, peak RSS, events per second."""
    from rich.table import Table

    from common.errors import BadInput
    from common.validate import check_memory, check_out_file
    from rlhfops.console import make_console, progress
    from scheduling.bench import bench_matrix

    if jobs < 1 or gpus < 8 or not 0 < load <= 2:
        raise BadInput("bench sim: need --jobs >= 1, --gpus >= 8 (largest job), 0 < --load <= 2")
    check_out_file(out, "out")
    # 1.1 GiB measured for 1M jobs (README), rounded up to 1.3 KB per job
    check_memory(jobs * 1300.0, "jobs", f"a {jobs:,}-job simulation", "lower --jobs")
    if quick:
        jobs, gpus = min(jobs, 100_000), min(gpus, 1_638)
    console = make_console()
    with progress(console, "E1-E8 matrix", transient=True):
        result = bench_matrix(seeds=[42] if quick else None)
    console.print(f"E1-E8 matrix ({result['matrix_runs']} runs): {result['matrix_wall_s']:.2f}s")
    # The reference: the same policy with one heap event per checkpoint (the path LossAware and
    # EvalSched take), on the same cluster with a tenth of the jobs. The cluster, not the job count,
    # sets the cost per event: more jobs in flight means colder per-job state at each event.
    ref_jobs, ref_gpus = max(jobs // 10, 1), gpus
    with progress(console, transient=True) as shown:
        large = _run_in_child(shown, f"{jobs:,} jobs on {gpus:,} GPUs", jobs, gpus, load, True)
        ref = _run_in_child(shown, f"{ref_jobs:,} jobs, one event per checkpoint", ref_jobs, ref_gpus, load, False)
        same = _run_in_child(shown, f"{ref_jobs:,} jobs, coalesced", ref_jobs, ref_gpus, load, True)
    result.update(
        large={k: v for k, v in large.items()},
        million_jobs_wall_s=large["wall_s"] if jobs >= 1_000_000 else None,
        million_jobs_peak_rss_mib=large["peak_rss_mib"] if jobs >= 1_000_000 else None,
        events_per_s=large["events_per_s"],
        per_checkpoint_reference=ref, coalesced_at_reference_size=same,
        coalescing_speedup=ref["simulate_s"] / same["simulate_s"],
        quick=quick, python=platform.python_version(), machine=platform.machine(),
    )
    table = Table(title="rlhfops bench sim")
    table.add_column("figure")
    table.add_column("value", justify="right")
    table.add_row("E1-E8 matrix wall (s)", f"{result['matrix_wall_s']:.2f}")
    table.add_row(f"{jobs:,}-job run wall (s)", f"{large['wall_s']:.2f}")
    table.add_row(f"{jobs:,}-job run peak RSS (MiB)", f"{large['peak_rss_mib']:.0f}")
    table.add_row("events / s", f"{large['events_per_s']:,.0f}")
    table.add_row("events", f"{large['events']:,}")
    table.add_row(f"{ref_jobs:,} jobs on {ref_gpus:,} GPUs: one event per checkpoint / coalesced (s)",
                  f"{ref['simulate_s']:.2f} / {same['simulate_s']:.2f}")
    console.print(table)
    write_json(result, out)


def register(app: typer.Typer) -> None:
    for name in [*BENCH_MODULES, "bench_cli"]:
        importlib.import_module(f"rlhfops.commands.{name}").register_bench(bench_app)
    app.add_typer(bench_app, name="bench")
