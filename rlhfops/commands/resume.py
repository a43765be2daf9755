"""`rlhfops resume RUN_DIR`: continue a run the eval gate paused (PAUSED_BY_GATE) from its kept best checkpoint."""

from __future__ import annotations

from pathlib import Path

import typer

from common.errors import BadInput


def register(app: typer.Typer) -> None:
    @app.command("resume")
    def resume_cmd(
        run_dir: Path = typer.Argument(..., help="the paused job's run directory (runs/jobs/<tenant>/<name>, or "
                                       "<platform out>/<tenant>/<name>)"),
        detector: str = typer.Option(None, "--detector", help="eval-gate detector watching the continuation: NAME or "
                                     "NAME(param=value, ...), e.g. 'paired(margin=0.05)' (default: the job's own, "
                                     "else the platform default)"),
        steps: int = typer.Option(None, "--steps", help="total PPO steps (default: the job's config)"),
        verbose: bool = typer.Option(False, "--verbose", help="show Prefect's own log lines"),
    ) -> None:
        """Resume a paused run: the `rlhf-job` flow with `resume_paused` on the run directory; the run continues from
        the kept checkpoint's step, its state history, attribution and ledger record the pause and the resume."""
        import json

        from common.config import read_yaml_mapping
        from eval.detectors import DEFAULT_DETECTOR
        from training.job.lifecycle import JOB_DONE, paused_run
        from training.job.request import parse_detector, parse_request

        gate = parse_detector(detector, "--detector")  # checked before the run directory is read
        if not (run_dir / JOB_DONE).is_file():
            raise BadInput(f"run_dir: {run_dir} holds no ended job ({JOB_DONE} missing); give a paused job's run "
                           "directory")
        if paused_run(run_dir) is None:
            raise BadInput(f"run_dir: the job in {run_dir} is not paused by the eval gate with a kept checkpoint "
                           f"({JOB_DONE} says {json.loads((run_dir / JOB_DONE).read_text()).get('state')!r})")
        done = json.loads((run_dir / JOB_DONE).read_text())
        # read strictly, as every config is: a missing, empty or hand-edited file with a key given twice is one line
        config = read_yaml_mapping(run_dir / "config.resolved.yaml", "run_dir (its resolved config)")
        gpus = int(done.get("gpus") or 1)
        # the job as it was asked for, continued in its own run directory; checked before the server starts
        request = parse_request({"config": config, "tenant": done["tenant"], "name": done["name"],
                                 "overlap": done.get("overlap") or "full", "steps": steps,
                                 "detector": gate or done.get("detector") or DEFAULT_DETECTOR, "gpus": gpus,
                                 "cluster_gpus": max(gpus, 4), "out_root": str(run_dir), "run_dir": ".",
                                 "resume_paused": True})
        request.checked()
        from rlhfops.commands.flowrun import prefect_env, run_flow, start_prefect_api

        prefect_env(verbose)
        server = start_prefect_api()
        from flows.rlhf_job import rlhf_job
        from infra import tracking as T
        from rlhfops.console import make_console

        console = make_console()
        uri = T.init_store()
        res = run_flow(console, rlhf_job, "resume", server, request=request)
        console.print(f"{res['job']}: {res['state']} after {res['metrics']['steps']} steps "
                      f"(resumed from step {res['resumed_from']['best_step']}); states: {' -> '.join(res['history'])}")
        console.print(f"reason: {res['reason']}")
        console.print(f"MLflow run {res['run_id']}: mlflow ui --backend-store-uri {uri}")
