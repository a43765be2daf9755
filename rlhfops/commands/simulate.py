"""`rlhfops simulate EXP`: run an EvalStop experiment in the discrete-event simulator.

Heavy libraries (pandas, scipy, matplotlib, rich's tables) are imported inside the functions that
use them, so `rlhfops --help` and bad input stay fast; matplotlib only with `--plots`."""

from __future__ import annotations

import math
from pathlib import Path

import typer

from common.errors import BadInput
from common.validate import check_out_file, check_workers
from rlhfops.commands.args import parse_seeds
from rlhfops.console import make_console, progress


def check_corpus(corpus: Path) -> None:
    """A `--corpus` directory as `eval.corpus` reads it, or BadInput naming the flag."""
    if not (corpus / "runs.csv").is_file():
        raise BadInput(f"--corpus '{corpus}': no runs.csv (need <source>/traces.csv and runs.csv)")


def _pct(x: float) -> str:
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:.1f}%"


def summary_table(summary, title: str):
    """The summary frame as a rich table."""
    from rich.table import Table

    table = Table(title=title, title_justify="left")
    multi = summary["variant"].nunique() > 1
    cols = (["variant"] if multi else []) + ["scheduler", "JCT (min)", "TTFUC", "Wasted", "Saved", "Precision",
                                              "Recall", "FPR", "Stopped", "Jain", "p(JCT)"]
    for c in cols:
        table.add_column(c, justify="left" if c in ("variant", "scheduler") else "right")
    for _, r in summary.iterrows():
        p = r["jct_p_value"]
        table.add_row(*([str(r["variant"])] if multi else []), str(r["scheduler"]),
                      f"{r['jct_mean']:.1f} ± {r['jct_std']:.1f}", f"{r['ttfuc_mean']:.1f}",
                      _pct(r["wasted_frac"]), _pct(r["saved_frac"]), _pct(r["precision"]), _pct(r["recall"]),
                      _pct(r["fpr"]), f"{r['stopped']:.1f}", f"{r['jain']:.3f}",
                      "" if math.isnan(p) else f"{p:.3g}")
    return table


def experiment_request(exp: str, seeds: str | None, jobs: int | None, gpus: int | None, overrides: list[str],
                       out: Path | None, workers: int | None, plots: bool):
    """The command line as a validated `ExperimentRequest` (BadInput naming the field)."""
    from common.config import parse_overrides
    from common.validate import check_out_dir
    from scheduling.request import ExperimentRequest

    check_out_dir(out, "out")
    return ExperimentRequest.build(experiment=exp, seeds=parse_seeds(seeds), jobs=jobs, gpus=gpus,
                                   overrides=parse_overrides(overrides), out_dir=str(out) if out else None,
                                   workers=workers, plots=plots)


def run_with_progress(request, console):
    """`scheduling.request.run_experiment` with a progress bar (one tick per variant x seed), drawn once the
    request has passed every check."""
    from infra.ledger import tenant_costs
    from scheduling.experiments import run_units
    from scheduling.request import run_experiment

    def run(plan):
        with progress(console, f"{plan.config.name}: variant x seed", total=len(plan.units), transient=True) as shown:
            return run_units(plan.units, workers=request.workers, on_done=lambda _u: shown.advance())

    return run_experiment(request, tenant_costs=tenant_costs, run=run)


def register(app: typer.Typer) -> None:
    @app.command("simulate")
    def simulate_cmd(
        experiment: str = typer.Argument(..., help="E1..E8, or a path to an experiment YAML"),
        seeds: str = typer.Option(None, "--seeds", help="comma-separated seeds (default: the config's, "
                                  "42,123,456,789,1024)"),
        jobs: int = typer.Option(None, "--jobs", help="number of jobs per run (scales the experiment)"),
        gpus: int = typer.Option(None, "--gpus", help="cluster GPUs; the arrival rate scales with it so the "
                                 "load per GPU is unchanged"),
        set_: list[str] = typer.Option([], "--set", help="override a config field, e.g. "
                                       "--set workload.eval_noise.sigma=0.05 (repeatable)"),
        out: Path = typer.Option(None, "--out", help="output directory (default results/<EXP>)"),
        workers: int = typer.Option(None, "--workers", help="worker processes (default: all cores)"),
        plots: bool = typer.Option(False, "--plots/--no-plots", help="also draw <EXP>.png (matplotlib: about a "
                                   "second more)"),
    ) -> None:
        """Run an EvalStop experiment: prints the table, writes summary.csv, jobs.csv, per_seed.csv and tenants.csv
        (plots with --plots)."""
        request = experiment_request(experiment, seeds, jobs, gpus, set_, out, workers, plots)
        console = make_console()
        res = run_with_progress(request, console)
        cfg = res.plan.config
        console.print(summary_table(res.summary, f"{cfg.name}: {cfg.description} — {cfg.workload.jobs} jobs, "
                                    f"{cfg.workload.gpus} GPUs, seeds {','.join(map(str, cfg.seeds))}"))
        console.print("Means over seeds; JCT ± sd across seeds; p(JCT): Welch's t-test of per-job JCT against "
                      "the same base without early stop.")
        console.print(f"[green]done in {res.wall_s:.1f}s[/]: {res.out}/" + ", ".join(p.name for p in res.files))

    @app.command("reproduce")
    def reproduce_cmd(
        out: Path = typer.Option(Path("docs/reproduction.md"), "--out", help="markdown file to write"),
        workers: int = typer.Option(None, "--workers", help="worker processes (default: all cores)"),
    ) -> None:
        """Run E1-E8 (5 seeds) and write the paper's Tables 1-5, 7-9 beside ours as markdown."""
        from scheduling.experiments import EXPERIMENTS, load_experiment, units_for
        from scheduling.reproduce import render, run_all

        check_out_file(out, "out")
        check_workers(workers)
        console = make_console()
        total = sum(len(units_for(load_experiment(e))) for e in EXPERIMENTS)
        with progress(console, "E1-E8: variant x seed", total=total, transient=True) as shown:
            summary = run_all(workers, on_done=lambda _u: shown.advance())
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(render(summary))
        console.print(f"[green]wrote {out}[/]")

    @app.command("select-detector")
    def select_detector_cmd(
        corpus: Path = typer.Option(Path("data/curves"), "--corpus", help="real-curve corpus directory "
                                    "(<source>/traces.csv + runs.csv with label, peak_step, split)"),
        out: Path = typer.Option(Path("docs/detector-selection.md"), "--out", help="markdown file to write"),
        target_fsr: float = typer.Option(0.02, "--target-fsr", help="false-stop rate each candidate's bar is "
                                         "calibrated to"),
        workers: int = typer.Option(None, "--workers", help="worker processes (default: all cores)"),
        write_config: bool = typer.Option(False, "--write-config", help="record the chosen candidate in --config "
                                          "as a new version"),
        config: Path = typer.Option(None, "--config", help="detector config the candidates start from and "
                                    "--write-config writes (default: configs/detectors.yaml)"),
    ) -> None:
        """Choose the default detector's shape (mean window, patience, drawdown, deep-drop path) on the corpus parts
        already seen, by the rule of studies/detector_selection.py; writes the ranked candidates as markdown."""
        import os

        from studies.detector_selection import (
            DETECTOR,
            SELECTION_SPLITS,
            candidates,
            chosen_params,
            render,
            score_candidates,
            selection_runs,
        )

        check_out_file(out, "out")
        check_workers(workers)
        check_corpus(corpus)
        if not 0.0 < target_fsr < 1.0:
            raise BadInput(f"--target-fsr {target_fsr}: must be in (0, 1)")
        if config is not None and not config.is_file():
            raise BadInput(f"--config '{config}': no such file")
        runs = selection_runs(corpus)
        if not any(r.label == 0 for r in runs):
            raise BadInput(f"--corpus '{corpus}': no healthy runs in the splits {SELECTION_SPLITS}")
        console = make_console()
        with progress(console, f"{DETECTOR} candidates", total=len(candidates()), transient=True) as shown:
            table = score_candidates(runs, target_fsr, workers=workers or os.cpu_count() or 1,
                                     on_done=lambda _row: shown.advance(), config=config)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(render(table, target=target_fsr))
        params = chosen_params(table)
        console.print(f"chosen: {DETECTOR} {params} -> {out}")
        if write_config:
            from eval.calibrate import write_config as record

            r0 = table.iloc[0]
            path = record(DETECTOR, params, target_fsr, f"{corpus.as_posix().rstrip('/')} splits "
                          f"{'+'.join(SELECTION_SPLITS)}", int(r0.healthy), int(r0.fp),
                          note=f"chosen by `rlhfops select-detector` ({out}): {int(r0.useful)}/{int(r0.hacking)} "
                               "useful on those splits", path=config)
            console.print(f"[green]recorded in {path}[/]")

    @app.command("detector-frontier")
    def detector_frontier_cmd(
        corpus: Path = typer.Option(Path("data/curves"), "--corpus", help="real-curve corpus directory "
                                    "(<source>/traces.csv + runs.csv with label, peak_step, split)"),
        split: list[str] = typer.Option(["report"], "--split", help="corpus split to read (repeat to pool several)"),
        out: Path = typer.Option(Path("docs/detector-frontier.md"), "--out", help="markdown file to write"),
        workers: int = typer.Option(None, "--workers", help="worker processes (default: all cores)"),
        config: Path = typer.Option(None, "--config", help="detector config the shapes start from (default: "
                                    "configs/detectors.yaml)"),
    ) -> None:
        """In hindsight, the most useful stops every shape of the selection grid reaches on a corpus split at each
        number of calibration-fleet runs stopped: an upper bound on what any version of the default detector can
        reach there; writes markdown."""
        import os

        from eval.corpus import ALL_SPLITS, CHOSEN_ON_SPLITS
        from studies.detector_frontier import default_point, frontier, render
        from studies.detector_selection import candidates, selection_runs

        check_out_file(out, "out")
        check_workers(workers)
        check_corpus(corpus)
        unknown = [s for s in split if s not in ALL_SPLITS]
        if unknown:
            raise BadInput(f"--split '{unknown[0]}': not a corpus split; use one of {', '.join(ALL_SPLITS)}")
        if config is not None and not config.is_file():
            raise BadInput(f"--config '{config}': no such file")
        splits = tuple(dict.fromkeys(split))
        runs = selection_runs(corpus, splits)
        fleet = [r for r in selection_runs(corpus, CHOSEN_ON_SPLITS) if r.label == 0]
        hacking, healthy = sum(r.label == 1 for r in runs), sum(r.label == 0 for r in runs)
        if not hacking or not healthy:
            raise BadInput(f"--split {'+'.join(splits)}: needs hacking and healthy runs (has {hacking} and "
                           f"{healthy}); pick another split")
        console = make_console()
        with progress(console, "shapes", total=len(candidates()), transient=True) as shown:
            table = frontier(runs, fleet, workers=workers or os.cpu_count() or 1, config=config,
                             on_done=lambda _c: shown.advance())
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(render(table, splits, CHOSEN_ON_SPLITS, hacking, healthy, len(fleet),
                              default_point(runs, fleet, config=config)))
        console.print(f"[green]wrote {out}[/]")

    @app.command("compare-detectors")
    def compare_detectors_cmd(
        out: Path = typer.Option(Path("docs/detectors.md"), "--out", help="markdown file to write"),
        workers: int = typer.Option(None, "--workers", help="worker processes (default: all cores)"),
        traces: Path = typer.Option(None, "--traces", help="also replay a labelled Trace CSV of real runs "
                                    "(from `rlhfops record-traces`) through every detector"),
        corpus: Path = typer.Option(None, "--corpus", help="real-curve corpus directory (<source>/traces.csv + "
                                    "runs.csv with label, peak_step, split): every detector on its report and "
                                    "tune halves, usefulness first"),
    ) -> None:
        """Every detector on E7 (Gaussian, Student-t, AR(1) noise) and E8: precision, recall, FPR, JCT,
        wasted compute, detection delay, regret; writes docs/detectors.md."""
        from studies.detector_report import render, render_replay, replay_traces, report_units, run_report

        check_out_file(out, "out")
        check_workers(workers)
        if corpus is not None:
            check_corpus(corpus)
        from studies.detector_report import fresh_seed_bars, render_fresh

        console = make_console()
        with progress(console, transient=True) as shown:
            replay = None
            if traces is not None:
                from eval.traces import load_trace

                shown.stage(f"every detector on {traces.name}")
                replay = render_replay(replay_traces(traces), traces.name, load_trace(traces).run_id.nunique())
            if corpus is not None:
                from eval.corpus import ALL_SPLITS
                from studies.detector_report import corpus_table, render_corpus

                shown.stage(f"every detector on {corpus}: splits", total=len(ALL_SPLITS))
                tables = {}
                for split in ALL_SPLITS:
                    tables[split] = corpus_table(corpus, split)
                    shown.advance()
                replay = render_corpus(tables, corpus) + (replay or "")
            shown.stage("the default detector on 20 fresh 5-seed sets per condition")
            replay = render_fresh(fresh_seed_bars(sets=20, workers=workers)) + "\n" + (replay or "")
            shown.stage("detectors: variant x seed", total=len(report_units()))
            table = run_report(workers, on_done=lambda _u: shown.advance())
        out.parent.mkdir(parents=True, exist_ok=True)
        text = render(table)
        if replay:
            head, sep, tail = text.partition("## Verdict")
            text = head + replay + "\n" + sep + tail
        from studies.paired_report import keep_section

        out.write_text(keep_section(out, text))
        console.print(f"[green]wrote {out}[/]")
