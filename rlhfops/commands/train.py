"""`rlhfops train CONFIG`: one PPO job with OPPO overlap; checkpoints and a per-step metrics CSV."""

from __future__ import annotations

import json
import math
from pathlib import Path

import typer

from common.errors import BadInput

OVERLAP_HELP = ("none: sequential PPO; intra: stream C-token chunks to the reward/reference/critic while "
                "decoding; inter: start B+Delta prompts, train on the first B to finish, defer the rest; "
                "full: both (OPPO)")


def failure_lines(record: dict, path: Path) -> list[str]:
    """What a FAILED run prints: its class and reason, up to three of the samples the tenant's code failed on, and
    where the rest is, naming only what `path` (its job.json) holds and a checkpoint only when one was saved."""
    lines = [f"[red]failed ({record.get('failure_class')}):[/red] {record.get('reason')}"]
    for example in record.get("examples", [])[:3]:
        if isinstance(example, dict):
            lines.append(f"  prompt {str(example.get('prompt'))[:80]!r} -> {str(example.get('error'))[:120]}")
        else:
            lines.append(f"  {str(example)[:200]}")
    held = [what for key, what in (("examples", "examples"), ("traceback", "the traceback"),
                                   ("alerts", "the health history")) if record.get(key)]
    lines.append(f"{', '.join(held) + ' and the' if held else 'the'} run's record: {path}")
    if record.get("last_checkpoint"):
        lines.append(f"last checkpoint: {record['last_checkpoint']}")
    return lines


def tracked_run(request, spec):
    """The job's MLflow run (`infra.job_run.JobRun`, the helpers the rlhf-job flow's run is written with) when
    MLFLOW_TRACKING_URI is set, else None: a plain `rlhfops train` writes no store of its own."""
    import os

    if not os.environ.get("MLFLOW_TRACKING_URI", "").strip():
        return None
    from infra.job_run import JobRun

    run = JobRun.open(request.tenant, request.name, spec.config,
                      {"config": request.config_label, "overlap": request.overlap, "gpus": request.gpus,
                       "detector": request.detector.label if request.detector is not None else "none"},
                      experiment=request.mlflow_experiment)
    run.uri = os.environ["MLFLOW_TRACKING_URI"]
    return run


def register(app: typer.Typer) -> None:
    @app.command("train")
    def train_cmd(
        ctx: typer.Context,
        config: Path = typer.Argument(..., help="PPO config YAML, e.g. configs/ppo-tiny.yaml"),
        overlap: str = typer.Option("full", "--overlap", help=OVERLAP_HELP),
        steps: int = typer.Option(None, "--steps", help="total PPO steps (default: the config's `steps`)"),
        out: Path = typer.Option(None, "--out", help="run directory (default runs/<config-stem>-<overlap>/)"),
        device: str = typer.Option(None, "--device", help="auto (CUDA when present), cpu, cuda or cuda:N; replaces "
                                   "the config's `device`"),
        dtype: str = typer.Option(None, "--dtype", help="float32, or bfloat16 (float32 master weights, bfloat16 "
                                  "forward passes); replaces the config's `dtype`"),
        gpus: int = typer.Option(1, "--gpus", help="ranks (GPU slots): data-parallel processes on torch.distributed "
                                 "(NCCL on cuda, gloo on cpu); the step's batch is split over them (docs/ranks.md)"),
        fresh: bool = typer.Option(False, "--fresh", help="ignore checkpoints in the run directory and start over"),
        trace: Path = typer.Option(None, "--trace", help="also write a Trace CSV here (docs/ARCHITECTURE.md)"),
        label: int = typer.Option(None, "--label", help="Trace CSV label for this run: 1 hacking, 0 healthy"),
        tenant: str = typer.Option("local", "--tenant", help="the tenant the job runs and is logged under"),
        name: str = typer.Option(None, "--name", help="the job's name (default: from the config file's name)"),
        detector: str = typer.Option(None, "--detector", help="eval-gate detector, e.g. paired (the platform "
                                     "round's gate, margin 0.1), 'paired(margin=0.05)' or evalstop: NAME or "
                                     "NAME(param=value, ...), a parameter left out getting the platform's setting; "
                                     "the job's supervisor runs it at every gate and a stop pauses the run there "
                                     "(PAUSED_BY_GATE, best checkpoint kept, the evidence in OUT/job.json; `rlhfops "
                                     "resume OUT` continues it). Default: no gate, every step is trained"),
    ) -> None:
        """Train a policy with PPO (+ OPPO overlap); writes OUT/metrics.csv, OUT/checkpoints/, OUT/summary.json; with
        MLFLOW_TRACKING_URI set, also an MLflow run `<tenant>/<name>` (params, step metrics, lineage, how it ended)."""
        from common.validate import check_out_dir, check_out_file
        from training.job.request import build, job_name, parse_detector, parse_request

        if label not in (None, 0, 1):
            raise BadInput("--label: must be 0 (healthy) or 1 (hacking)")
        gate = parse_detector(detector, "--detector")  # its name and parameters, before anything is read or written
        out = out or Path("runs") / f"{config.stem}-{overlap}"
        check_out_dir(out, "out")
        check_out_file(trace, "trace")
        # the job, as every entry point asks for one: one run directory (OUT itself); with --detector its supervisor
        # gates it as the platform does (the same builder, planned steps and rule), without one every step is run
        request = parse_request({"config": str(config), "overlap": overlap, "steps": steps, "tenant": tenant,
                                 "name": name or job_name(config.stem), "detector": gate, "out_root": str(out),
                                 "run_dir": ".", "resume": not fresh, "device": device, "dtype": dtype,
                                 "gpus": gpus, "cluster_gpus": max(gpus, 4)})
        checked = request.checked()
        # torch: only once the request is known good, so a config error is reported in under a second

        from rlhfops.console import Progress, make_console
        from training.job.lifecycle import JOB_DONE, JobHooks, job_record, run_job
        from training.job.rundir import locked_run_dir
        from training.trace import export_trace
        from training.trainer import Trainer

        # one writer per run directory, held until the command ends (a second one exits 2 naming the holder)
        ctx.with_resource(locked_run_dir(out, "--out"))
        if fresh and out.exists():
            import shutil

            shutil.rmtree(out / "checkpoints", ignore_errors=True)
            (out / "metrics.csv").unlink(missing_ok=True)
        (out / JOB_DONE).unlink(missing_ok=True)  # the record of an earlier run's end: this run writes its own
        console = make_console()
        gated = gate is not None
        spec, supervisor = build(request, checked, run_id=f"{config.stem}-{overlap}", pausable=gated)
        total = spec.steps
        # a tenant's job is scored by its own gate, not the synthetic task's gold scorer: its lines say so
        score_word = "gate score" if spec.config.task.kind == "dataset" else "gold"
        seen = {"last": None, "best": (-math.inf, 0)}
        # a bar on a terminal; flushed done/total lines when the output is a pipe or a file (nohup, CI)
        progress = Progress(console)

        class TrainHooks(JobHooks):
            """`rlhfops train`'s side of the job: its own worker (resume unless --fresh), a progress bar; checkpoints
            are scored only under a gate, to know the one a pause keeps (the gold eval runs every `eval_every` steps
            inside training)."""

            def start_worker(self, spec):
                # a restart after a failed rank (max_rank_restarts) resumes from the checkpoint, --fresh or not
                trainer = Trainer(spec.config, spec.overlap, spec.out_dir, resume=not fresh or "started" in seen,
                                  progress=lambda m: console.print(f"[dim]{m}[/dim]"), gpus=spec.gpus)
                seen.setdefault("first", trainer.step)
                seen["started"] = True
                progress.stage(f"{spec.config.algorithm.upper()} {spec.overlap}", total=total)
                progress.update(trainer.step)  # a resumed run starts where its checkpoint is
                return trainer

            def on_step(self, rec, supervisor):
                seen["last"] = rec
                if not math.isnan(rec.gold_eval) and rec.gold_eval > seen["best"][0]:
                    seen["best"] = (rec.gold_eval, rec.step)
                gold = "" if math.isnan(rec.gold_eval) else f" {score_word} {rec.gold_eval:+.3f}"
                progress.update(rec.step)
                progress.status(f"reward {rec.reward_mean:+.3f}{gold} kl {rec.kl:.2f} Δ {rec.delta}")
                return None

            def score(self, spec, checkpoints):
                return super().score(spec, checkpoints) if gated else []

            def restarting(self, spec, error):
                console.print(f"[yellow]{error}; restarting from the last checkpoint[/yellow]")

        tracked = tracked_run(request, spec)  # None unless MLFLOW_TRACKING_URI is set
        hooks = TrainHooks()
        if tracked is not None:
            hooks.log_records = tracked.log_records
        try:
            with progress:
                outcome = run_job(spec, hooks=hooks, supervisor=supervisor)
        except BaseException as err:
            if tracked is not None:
                tracked.fail(err)
            raise
        if tracked is not None:
            tracked.close(outcome, {"steps": len(outcome.records), "train_wall_s": outcome.train_wall_s,
                                    "alerts_paged": len(supervisor.machine.pages)})
            console.print(f"MLflow run {tracked.run_id} ({request.tenant}/{request.name}) in {tracked.uri}")
        if outcome.status.state.value == "FAILED":  # whatever ended it: an error, the tenant's code, an alert
            record = {**job_record(outcome), "tenant": request.tenant, "name": request.name,
                      "detector": gate.label if gated else None, "overlap": request.overlap}
            (out / JOB_DONE).write_text(json.dumps(record, default=str))
            for line in failure_lines(record, out / JOB_DONE):
                console.print(line, soft_wrap=True)  # one line, however long the reason
            raise typer.Exit(1)
        last, first, best_gold = seen["last"], seen.get("first", 0), seen["best"]
        if last is None:
            console.print(f"nothing to do: {out} already holds step {first} of {total}")
            return
        paged = sorted({e.alert for e in supervisor.events if e.severity == "paging"})
        # no gate ran (fewer steps than eval_every): say so rather than print the -inf the search starts from
        gold = (f"best {score_word} {best_gold[0]:+.3f} @ step {best_gold[1]}" if best_gold[1] > 0 else
                f"no gate yet (every {spec.config.eval_every} steps)")
        from training.inputs import sandbox
        from training.inputs.job_inputs import tenant_refs

        sandboxed = sandbox.describe() if tenant_refs(spec.config) else None  # where the tenant's code ran
        console.print(
            f"[bold]{spec.config.algorithm} {spec.overlap}[/bold] steps {first + 1}-{last.step} in {last.wall_s:.1f}s "
            f"train wall | final reward {last.reward_mean:+.3f} | {gold} | run dir {out}"
            + (f" | tenant code sandbox: {sandboxed}" if sandboxed else "")
        )
        if paged:
            console.print(f"alerts paged: {', '.join(paged)} (run state {outcome.status.label})")
        if gated:
            import yaml

            from scheduling.live import describe_evidence, evidence_of

            record = job_record(outcome)
            paused = outcome.status.state.value == "PAUSED_BY_GATE"
            evidence = evidence_of(supervisor.gate_detector, supervisor.gate_monitor) if paused else None
            # what `rlhfops resume OUT` reads: the job's end, its gate's evidence, the config it ran
            (out / "config.resolved.yaml").write_text(yaml.safe_dump(spec.config.model_dump(mode="json"),
                                                                     sort_keys=False))
            (out / JOB_DONE).write_text(json.dumps({**record, "tenant": request.tenant, "name": request.name,
                                                    "detector": gate.label, "evidence": evidence,
                                                    "overlap": request.overlap, "gpus": request.gpus}, default=float))
            if paused:
                console.print(f"paused at step {record['paused_step']} by the eval gate ({record['reason']}); "
                              f"kept checkpoint: step {record['best_step']}; evidence: "
                              f"{describe_evidence(evidence)}; continue with: rlhfops resume {out}")
            else:
                console.print(f"eval gate ({gate.label}): no stop; run state {outcome.status.label}")
        if trace:
            n = export_trace(out / "metrics.csv", trace, run_id=f"{config.stem}-{overlap}", label=label)
            console.print(f"trace: {n} rows -> {trace}")
