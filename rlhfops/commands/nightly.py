"""`rlhfops nightly [--quick]`: the nightly sweep flow, locally, on embedded defaults (temporary Prefect API,
SQLite MLflow in the working directory)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import typer

from common.errors import BadInput
from rlhfops.commands.flowrun import prefect_env, run_flow, start_prefect_api


def split_list(text: str | None) -> list[str] | None:
    if text is None:
        return None
    if text.strip().lower() in ("", "none"):
        return []
    return [t.strip() for t in text.split(",") if t.strip()]


#: `--stages`: what each stage is (the stage names are flows.nightly_check.STAGES)
STAGES_HELP = ("comma-separated stages to run, of matrix (the E1-E8 simulation matrix), detectors, job (an RLHF job "
               "and its checkpoint's re-evaluation), canaries, sweep, platform, bench (the OPPO speed regression "
               "check, 10-60 minutes) (default: all, bench only without --quick; the report always runs). E.g. "
               "--stages matrix,detectors for the simulator only")


def parse_stages(text: str | None) -> set[str]:
    from flows.nightly_check import STAGES

    if text is None:
        return set(STAGES)
    stages = set(split_list(text) or [])
    unknown = sorted(stages - set(STAGES))
    if unknown:
        raise BadInput(f"--stages: '{unknown[0]}' is not a stage (choose from: {', '.join(STAGES)})")
    return stages


def register(app: typer.Typer) -> None:
    @app.command("nightly")
    def nightly_cmd(
        quick: bool = typer.Option(False, "--quick", help="seeds 42,123, a 24-step RLHF job, 60-step canaries, "
                                   "no OPPO bench unless --stages names it (under 10 minutes on 2 cores)"),
        runner: str = typer.Option("thread", "--runner", help="task runner for the simulation fan-out, and the "
                                   "launcher of the RLHF job's ranks with --job-gpus: thread (Prefect threads + a "
                                   "local process pool) or ray (needs pip install '.\\[ray]')"),
        workers: int = typer.Option(None, "--workers", help="compute processes for simulation units (default: "
                                    "all cores)"),
        experiments: str = typer.Option(None, "--experiments", help="comma-separated subset of E1..E8 "
                                        "(default: all)"),
        seeds: str = typer.Option(None, "--seeds", help="comma-separated seeds for the matrix and the detector "
                                  "comparison (default: 42,123 quick, the configs' five otherwise)"),
        no_detectors: bool = typer.Option(False, "--no-detectors", help="skip the detector comparison"),
        no_job: bool = typer.Option(False, "--no-job", help="skip the RLHF job and its checkpoint evaluation"),
        no_platform: bool = typer.Option(False, "--no-platform", help="skip the live multi-tenant platform round"),
        no_sweep: bool = typer.Option(False, "--no-sweep", help="skip the sweep stage"),
        sweep_spec: str = typer.Option("configs/sweeps/example.yaml", "--sweep-spec", help="the sweep stage's spec "
                                       "(2 trials with --quick, the spec's own count otherwise)"),
        job_steps: int = typer.Option(None, "--job-steps", help="PPO steps of the nightly's RLHF job "
                                      "(default: 24 quick, 60 full)"),
        job_config: str = typer.Option(None, "--job-config", help="the RLHF job's config instead of the small "
                                       "synthetic job (e.g. configs/ppo-arith.yaml, configs/grpo-arith.yaml for "
                                       "GRPO, or a tenant's dataset job)"),
        tenant: str = typer.Option(None, "--tenant", help="the RLHF job's tenant (default acme)"),
        name: str = typer.Option(None, "--name", help="the RLHF job's name (default nightly-<algorithm>)"),
        job_gpus: int = typer.Option(1, "--job-gpus", help="GPU slots the RLHF job holds: the data-parallel ranks "
                                     "it trains on (docs/ranks.md)"),
        canaries: str = typer.Option(None, "--canaries", help="comma-separated canaries to run, or 'none' "
                                     "(default: all: control, frozen_sync, constant_reward, oversized_lr, "
                                     "gameable_reward, behaviour_mismatch, duplicated_carry, grpo_control, "
                                     "grpo_constant_reward)"),
        fail_rate: float = typer.Option(0.0, "--fail-rate", help="inject transient failures into this share of "
                                        "task attempts (chaos test of the retries), 0..0.9"),
        out: Path = typer.Option(Path("results/nightly"), "--out", help="output directory"),
        cache_dir: str = typer.Option(None, "--cache-dir", help="warm-start cache (default: RLHFOPS_CACHE_DIR, "
                                      "else ~/.cache/rlhfops/warm-starts, as for a config without cache_dir)"),
        verbose: bool = typer.Option(False, "--verbose", help="show Prefect's own log lines (task states)"),
        stages_text: str = typer.Option(None, "--stages", help=STAGES_HELP),
        bench_baseline: str = typer.Option("docs/bench/oppo-baseline.json", "--bench-baseline", help="the bench "
                                           "stage's baseline JSON (a `bench oppo --quick --out` run of the same "
                                           "steps and seeds), or 'none' for no comparison"),
        bench_steps: int = typer.Option(None, "--bench-steps", help="steps per bench run (default: 30, as "
                                        "`bench oppo --quick`)"),
        bench_seeds: int = typer.Option(None, "--bench-seeds", help="seeds per bench mode (default: 3)"),
    ) -> None:
        """Run the nightly sweep flow locally: E1-E8 simulation matrix, detector comparison, a real RLHF job
        (best checkpoint registered and re-evaluated), health canaries, a live platform round, and
        tonight-vs-last-night. Writes
        OUT/report.md and MLflow runs (sqlite:///mlflow.db unless MLFLOW_TRACKING_URI is set). Every input is checked
        before the Prefect server starts; when the output is not a terminal (cron, nohup, CI) each stage prints a
        line as it starts and as it advances."""
        t_process = time.time()
        from common.validate import check_out_dir
        from flows.nightly_check import check_nightly
        from rlhfops.commands.simulate import parse_seeds

        stages = parse_stages(stages_text)
        from training.job.config import default_cache_dir

        cache_dir = cache_dir or default_cache_dir()
        check_out_dir(out, "out")
        if not 0.0 <= fail_rate <= 0.9:
            raise BadInput("--fail-rate: must be between 0 and 0.9")
        params = dict(quick=quick, experiments=split_list(experiments) if "matrix" in stages else [],
                      seeds=parse_seeds(seeds), detectors="detectors" in stages and not no_detectors,
                      job="job" in stages and not no_job, job_steps=job_steps, job_config=job_config,
                      job_tenant=tenant, job_name=name, job_gpus=job_gpus,
                      canaries=split_list(canaries) if "canaries" in stages else [],
                      platform="platform" in stages and not no_platform, sweep="sweep" in stages and not no_sweep,
                      sweep_spec=sweep_spec, runner=runner, workers=workers, out_dir=str(out), cache_dir=cache_dir,
                      bench="bench" in stages if stages_text is not None else not quick,
                      bench_baseline=None if bench_baseline.strip().lower() in ("", "none") else bench_baseline,
                      bench_steps=bench_steps, bench_seeds=bench_seeds)
        # every input, before the Prefect server starts (10-18 s) or torch is imported: a bad one fails in a second
        check_nightly(**{k: v for k, v in params.items() if k not in ("detectors", "platform")})
        prefect_env(verbose)
        server = start_prefect_api()
        import transformers

        from infra import tracking as T
        from rlhfops.console import make_console
        from tasks.timing import clock

        transformers.logging.set_verbosity_error()  # checkpoint loads report tied lm_head weights as missing
        clock.reset()
        console = make_console()
        prefect_api = os.environ.get("PREFECT_API_URL")
        console.print(f"[dim]Prefect API: {prefect_api or 'temporary local server (starting)'}[/dim]")
        with clock.span("tracking"):
            uri = T.init_store()
        console.print(f"[dim]MLflow store: {uri}[/dim]")
        from flows.nightly import nightly_sweep  # with the trainer (torch): while the server starts

        res = run_flow(console, nightly_sweep, "nightly", server, **params,
                       internals={"fail_rate": fail_rate})
        process = clock.breakdown(t_process, time.time())
        T.log_metrics(res.run_id, {"process_wall_s": process["wall_s"],
                                      "process_orchestration_s": process["orchestration_s"],
                                      "process_orchestration_frac": process["orchestration_frac"]})
        print_summary(console, res, process, uri, prefect_api)


def print_summary(console, res, process: dict, uri: str, prefect_api: str | None = None) -> None:
    """The nightly's result (`flows.nightly.NightlyResult`) as one table, then where to look: the servers this run
    used (`prefect_api`: the configured PREFECT_API_URL, None for the temporary server; `uri`: the MLflow store)."""
    from rich.table import Table

    t = res.timing
    table = Table(title="rlhfops nightly", title_justify="left", show_header=False)
    table.add_column("what")
    table.add_column("result")
    m = res.matrix
    if m is not None:
        table.add_row("scheduling matrix", f"{m['experiment'].nunique()} experiments, {len(m)} scheduler rows: "
                      f"{res.out_dir}/scheduling/<EXP>/summary.csv and plots")
    if res.detectors is not None:
        table.add_row("detectors", f"{len(res.detectors)} detector rows: {res.out_dir}/detectors.md")
    job = res.job
    if isinstance(job, dict):
        best = job.get("best") or {}
        reg = job.get("registry") or {}
        where = (f"registered as models:/{reg['model']}/{reg['version']}" if reg
                 else "not registered (only a run that ended SUCCEEDED or was paused by its gate registers its "
                      "checkpoint)")
        table.add_row("rlhf job", f"{job['state']} after {job['metrics']['steps']} steps; best checkpoint step "
                      f"{best.get('step', '—')} (held-out {best.get('eval_score', float('nan')):+.3f}) {where}"
                      + promotion_words(reg))
    elif job is not None:
        table.add_row("rlhf job", f"[red]failed[/red]: {job}")
    pf = res.platform
    if pf:
        jobs = pf["jobs"]
        table.add_row("platform round", f"{len(jobs)} tenant jobs on {pf['slots']}: "
                      f"{int((jobs.decision == 'stopped').sum())} stopped by the scheduler, makespan "
                      f"{pf['metrics']['makespan_s']:.0f} s (results/…/platform/jobs.csv)")
    sw = res.sweep
    if sw:
        best = sw.get("best") or {}
        table.add_row("sweep", f"{sw['trials_done']} trials ({sw['trials_pruned']} pruned, {sw['trials_failed']} "
                      f"failed), {sw['gpu_seconds'] / 3600:.3f} GPU-h; best trial {best.get('number', '—')} held-out "
                      f"{best.get('objective', float('nan')):+.3f} ({res.out_dir}/sweep/report/sweep.md)")
    b = res.bench
    if b:
        gold = ", ".join(f"{k} {v:.2f}x" if v else f"{k} n/a" for k, v in b["speedup_gold"].items())
        if not b["compared"]:
            verdict = "no baseline"
        elif b["regressed"]:
            verdict = "[red]REGRESSED: " + ", ".join(
                f"{r['ratio']} {r['baseline_median']:.2f}x -> {r['current_median']:.2f}x ({r['change']:+.0%})"
                for r in b["regressed"]) + "[/red]"
        else:
            verdict = "no ratio fell beyond its noise"
        table.add_row("oppo bench", f"time-to-gold speedup (median of {len(b['seeds'])} seeds) {gold}; against "
                      f"{b['baseline'] or '-'}: {verdict} ({b['json']})")
    ev = res.evaluation
    if ev:
        table.add_row("checkpoint gate", f"re-scored from the registry: {ev['eval_score']:+.3f} ± {ev['eval_se']:.3f}")
    c = res.canaries
    if c is not None:
        bad = list(c.loc[~c["ok"], "canary"])
        table.add_row("canaries", f"{int(c['ok'].sum())}/{len(c)} ok" + (f" [red](failed: {', '.join(bad)})[/red]"
                                                                        if bad else ""))
    table.add_row("time", f"{process['wall_s']:.0f} s in all (flow {t['wall_s']:.0f} s); orchestration "
                  f"{process['orchestration_s']:.1f} s = {100 * process['orchestration_frac']:.1f}% of the process "
                  f"wall ({100 * t['orchestration_frac']:.1f}% of the flow's), MLflow {t['tracking_s']:.1f} s")
    console.print(table)
    console.print("Where to look:")
    console.print(f"  report      {res.out_dir}/report.md  (or `rlhfops report`)")
    for line in server_hints(uri, prefect_api, run_link(uri, res.run_id)):
        console.print(f"  {line}", markup=False, highlight=False)


def promotion_words(reg: dict) -> str:
    """What the registry decided on the job's version, for the summary: nothing more when it took `best`; the
    one-line reason when it did not (a refusal for a changed gate names the identity part that changed)."""
    if not reg or reg.get("alias_best"):
        return "" if not reg else " (alias best)"
    return f"; best not moved: {reg.get('promotion') or 'no reason recorded'}"


def run_link(uri: str, run_id: str, experiment: str | None = None) -> str:
    """The nightly's run in the MLflow UI, in its "Model training" view (`infra.tracking.ui_url`): on the tracking
    server itself (`uri` http...), else where `mlflow ui` serves a local store (`MLFLOW_UI_URL`, default its own
    address)."""
    from infra import tracking as T

    base = uri if uri.startswith(("http://", "https://")) else os.environ.get("MLFLOW_UI_URL")
    return T.ui_url(**({"base": base} if base else {}), experiment=experiment or T.DEFAULT_EXPERIMENT,
                    run_id=run_id)


def server_hints(uri: str, prefect_api: str | None, link: str | None = None) -> list[str]:
    """Where the MLflow and Prefect UIs of this run are: the servers it used. A tracking server (http...) is named
    as it is; a local store gets the `mlflow ui` command that opens it; `link` (`run_link`), the nightly's run
    there. A configured Prefect API is named (its UI is the URL without /api); on the temporary server, which
    stopped with the run, the hint says how to keep one."""
    if uri.startswith(("http://", "https://")):
        mlflow = f"MLflow UI   {link or uri}"
    else:
        mlflow = f"MLflow UI   mlflow ui --backend-store-uri {uri}   (store: {uri.removeprefix('sqlite:///')})"
        if link:
            mlflow += f", then {link}"
    if prefect_api:
        prefect = f"Prefect UI  {prefect_api.rstrip('/').removesuffix('/api')}   (API {prefect_api})"
    else:
        prefect = ("Prefect UI  this run used a temporary server, gone with it: `prefect server start`, then rerun "
                   "with PREFECT_API_URL=http://127.0.0.1:4200/api")
    return [mlflow, prefect]
