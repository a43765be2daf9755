"""`rlhfops platform`: a live multi-tenant round (real small PPO jobs on a fixed pool of worker slots, placed and
stopped by the same scheduler objects as the simulator), recorded in MLflow."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from common.errors import BadInput


def register(app: typer.Typer) -> None:
    @app.command("platform")
    def platform_cmd(
        scheduler: str = typer.Option("Paired+SRTF", "--scheduler", help="the simulator's scheduler names: a base "
                                      "(FIFO, SJF-Est, SRTF-Est, LossAware, EvalSched) optionally wrapped by an "
                                      "early-stop detector, each job's eval gate, e.g. NoisePatience+SRTF, "
                                      "EvalStop(k=3)+SJF, Paired(margin=0.05)+SRTF (a parameter left out gets the "
                                      "platform's setting: the paired rule's margin 0.1)"),
        slots: int = typer.Option(2, "--slots", help="GPU worker slots in the pool (a Prefect global concurrency "
                                  "limit; jobs hold theirs while they train)"),
        steps: int = typer.Option(24, "--steps", help="PPO steps per job (the 'short' job runs half)"),
        jobs: Path = typer.Option(None, "--jobs", help="JSON list of jobs [{tenant, name, config, overrides, gpus, "
                                  "steps_factor}] (config: a tenant's own PPO config, relative to the file's folder; "
                                  "default: the round's small config; no --jobs: five tenants, one job each)"),
        out: Path = typer.Option(Path("results/platform"), "--out", help="output directory"),
        cache_dir: str = typer.Option(None, "--cache-dir", help="warm-start cache (default: RLHFOPS_CACHE_DIR, "
                                      "else ~/.cache/rlhfops/warm-starts, as for a config without cache_dir)"),
        resume_paused: bool = typer.Option(False, "--resume-paused", help="run only the jobs an earlier round in --out "
                                           "paused (PAUSED_BY_GATE), each from its kept checkpoint"),
        seed: int = typer.Option(0, "--seed", help="the jobs' config seed: warm starts, prompts and training change "
                                 "with it"),
        verbose: bool = typer.Option(False, "--verbose", help="show Prefect's own log lines"),
    ) -> None:
        """Run one live round: tenants' PPO jobs queued at once, placed on --slots worker slots by --scheduler
        (which may also stop them at their eval gates); prints per-job and per-tenant results."""
        from rlhfops.commands.flowrun import prefect_env, run_flow, start_prefect_api

        if slots < 1:
            raise BadInput("--slots: must be >= 1")
        if steps < 4:
            raise BadInput("--steps: must be >= 4")
        if not 0 <= seed <= 2**32 - 1:
            raise BadInput(f"--seed: {seed} is out of range: give a value in 0..{2**32 - 1}")
        from common.validate import check_out_dir
        from scheduling.policies import parse_scheduler

        try:
            parse_scheduler(scheduler)
        except ValueError as err:
            raise BadInput(f"scheduler: {err}") from None
        from infra.provision import check_slot_settings

        check_slot_settings()
        check_out_dir(out, "out")
        from training.job.config import default_cache_dir

        cache_dir = cache_dir or default_cache_dir()
        check_out_dir(cache_dir, "cache_dir")
        job_list = None
        if jobs is not None:
            try:
                job_list = json.loads(jobs.read_bytes().decode("utf-8"))
            except UnicodeDecodeError:
                raise BadInput(f"jobs: '{jobs}' is not UTF-8 text (save it as UTF-8)") from None
            except (OSError, json.JSONDecodeError) as err:
                raise BadInput(f"jobs: cannot read a JSON list from '{jobs}' ({err})") from None
            if not isinstance(job_list, list):
                raise BadInput("jobs: the file must hold a JSON list of job objects")
        # every job as a checked request (names, overrides, GPUs, config), before the server starts
        from flows.params import DEFAULT_JOBS, check_round, jobs_relative_to, round_requests, scheduler_gate

        if jobs is not None:
            job_list = jobs_relative_to(job_list, jobs.resolve().parent)

        check_round(round_requests(job_list or DEFAULT_JOBS, steps=steps, slots=slots, out_dir=str(out),
                                   cache_dir=cache_dir, detector=scheduler_gate(scheduler), seed=seed))
        prefect_env(verbose)
        server = start_prefect_api()
        import transformers
        from rich.table import Table

        from flows.platform_round import platform_round
        from infra import tracking as T
        from rlhfops.console import make_console

        transformers.logging.set_verbosity_error()
        console = make_console()
        uri = T.init_store()
        res = run_flow(console, platform_round, "platform round", server, jobs=job_list, scheduler=scheduler,
                       slots=slots, steps=steps, out_dir=str(out), cache_dir=cache_dir, resume_paused=resume_paused,
                       seed=seed)
        df = res["jobs"].sort_values("start_order")
        table = Table(title=f"platform round: {scheduler}, {res['slots']}", title_justify="left")
        for col in ("start", "tenant", "job", "algorithm", "decision", "decided by", "state", "steps", "best step",
                    "best held-out", "JCT (s)", "cost (USD)"):
            table.add_column(col)
        for _, r in df.iterrows():
            table.add_row(str(r.start_order + 1), r.tenant, r.job, r.algorithm, r.decision, r.decided_by, r.state,
                          str(int(r.steps)), str(r.best_step), f"{r.best_eval:+.3f}", f"{r.jct_s:.1f}",
                          f"{r.cost_usd:.6f}")
        console.print(table)
        from scheduling.live import describe_evidence

        for _, r in df[df.decision == "stopped"].iterrows():  # what paused each paused job, in one line
            evidence = json.loads(r.pause_evidence) if isinstance(r.pause_evidence, str) and r.pause_evidence else None
            console.print(f"{r.tenant}/{r.job} paused at step {r.stopped_at:g} (best step {r.best_step}): "
                          f"{describe_evidence(evidence)}")
        console.print(f"results: {out}/jobs.csv, {out}/ledger.csv; MLflow: mlflow ui --backend-store-uri {uri}")
