"""The fault-injection canaries: real small PPO runs with an injected fault, fed step by step through the alert
catalog and the run state machine. Every alert must fire under its fault; the healthy control must stay quiet (the
runbook's verification step: "every alert fires under injected failure"). Also the small healthy job the nightly
and the platform round start from (`base_config`).

Plain Python: the CLI (`rlhfops canary`) and the nightly's canary task call `run_canary`."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Canary:
    name: str
    #: the trainer's `fault:` block (training/job/config.py FaultConfig); None for the control
    fault: dict | None
    #: the alert that must fire (None: nothing may page)
    expected: str | None
    #: config overrides on top of the shared base (dotted keys)
    overrides: dict = field(default_factory=dict)
    #: the trainer's overlap mode (the carried-sample alerts need inter-step overlap)
    overlap: str = "none"


CANARIES = (
    Canary("control", None, None),
    Canary("frozen_sync", {"kind": "frozen_sync"}, "sync_stall"),
    Canary("constant_reward", {"kind": "constant_reward"}, "dead_run"),
    Canary("oversized_lr", {"kind": "lr_spike", "factor": 50.0}, "kl_blowup"),
    Canary("gameable_reward", {"kind": "gameable_reward", "bonus": 1.0, "trigger": "z"}, "reward_hacking"),
    # the off-policy alerts (docs/oppo.md). The engine samples at 8x the trainer's temperature: pi_prox/pi_behav
    # spreads on every token (with the decoupled correction the update does not chase the hot samples, so the
    # mismatch persists)
    Canary("behaviour_mismatch", {"kind": "behaviour_mismatch", "factor": 8.0}, "low_ess",
           {"oppo.correction": "decoupled"}),
    # carried responses get their tokens appended twice on resume (inter-step overlap): carried samples jump in
    # length against fresh ones
    Canary("duplicated_carry", {"kind": "duplicated_carry"}, "carried_length_drift", {"ppo.max_new_tokens": 128},
           overlap="full"),
    # the critic-free group methods (`algorithm: grpo`, its default 8 completions per prompt: 4 groups a step): a
    # constant reward makes every group flat (no learning signal at all); the control is the same healthy job
    Canary("grpo_control", None, None, {"algorithm": "grpo"}),
    Canary("grpo_constant_reward", {"kind": "constant_reward"}, "flat_groups", {"algorithm": "grpo"}),
)


def base_config(steps: int, fault_at: int, cache_dir: str) -> dict:
    """A small healthy PPO job on the synthetic task: a strong KL penalty and a modest learning rate keep
    the policy near the base distribution where proxy and gold agree (training/inputs/synthetic_task.py), and a batch of
    32 keeps per-step reward noise low enough that learning is visible within the canary's windows."""
    return {
        "seed": 0, "steps": steps,
        "task": {"n_train_prompts": 128, "n_heldout_prompts": 32, "n_pairs": 400, "rm_epochs": 1,
                 "sft_steps": 150, "rm_trainer": "torch"},
        "ppo": {"batch_size": 32, "max_new_tokens": 32, "kl_coef": 0.1, "actor_lr": 3e-4, "critic_lr": 1e-3},
        "eval_every": 2, "eval_prompts": 16, "checkpoint_every": 10_000, "cache_dir": cache_dir,
        "fault": {"kind": "none", "at_step": fault_at},
    }


def canary_spec(canary: Canary, steps: int, fault_at: int, cache_dir: str):
    """The canary's job: the shared base with its fault and overrides, no run directory, its overlap mode."""
    from common.validate import set_dotted
    from training.job.config import TrainConfig
    from training.job.lifecycle import JobSpec

    raw = base_config(steps, fault_at, cache_dir)
    raw["name"] = f"canary-{canary.name}"
    if canary.fault:
        raw["fault"].update(canary.fault)
    for key, value in canary.overrides.items():
        set_dotted(raw, key, value)
    return JobSpec(tenant="canary", name=canary.name, config=TrainConfig.model_validate(raw),
                   run_id=f"canary-{canary.name}", overlap=canary.overlap, gpu_kind="cpu",
                   run_through_pause=canary.expected is not None)


def run_canary(canary: Canary, steps: int, fault_at: int, cache_dir: str, catalog: Any, metrics: Any = None,
               ledger: Any = None, progress: Any = None) -> dict:
    """Run one canary: a real PPO job fed step by step through the catalog and the run state machine
    (`training.job.lifecycle.run_job`). A fault canary stops as soon as its expected alert fired (proof obtained); the
    control runs in full."""
    from eval.states import RunState
    from training.job.lifecycle import JobHooks, make_supervisor, run_job

    spec = canary_spec(canary, steps, fault_at, cache_dir)
    # the catalog given (thresholds file and profile) built for this canary's algorithm: its thresholds, and only
    # the alerts that apply to it (a grpo canary gets the group alerts, no critic alert)
    if hasattr(catalog, "for_algorithm"):
        catalog = catalog.for_algorithm(spec.config.algorithm)
    sup = make_supervisor(spec, ledger=ledger, metrics=metrics, catalog=catalog)
    fired_at = math.nan

    class CanaryHooks(JobHooks):
        stop_by = "alert"  # the canary stops once its expected alert fired

        def on_step(self, record: Any, supervisor: Any) -> str | None:
            nonlocal fired_at
            for ev in supervisor.events:
                if ev.alert == canary.expected and math.isnan(fired_at):
                    fired_at = ev.step
            if progress is not None:
                progress(record.step)
            if canary.expected is not None and not math.isnan(fired_at):
                return f"{canary.expected} fired"
            return None

    t0 = time.perf_counter()
    error: BaseException | None = None
    try:
        outcome = run_job(spec, hooks=CanaryHooks(), supervisor=sup)
        status, error = outcome.status, outcome.error
    except Exception as err:  # a crashed canary is a failed canary, reported in the table
        error = err
        status = sup.finish(completed=False, exception=err)
    paged = [e.alert for e in sup.events if e.severity == "paging"]
    moved = any(s.state in (RunState.DEGRADED, RunState.PAUSED_BY_GATE) for s in sup.machine.history)
    if canary.expected is None:
        ok = error is None and not paged and status.state is RunState.SUCCEEDED
    else:
        ok = error is None and not math.isnan(fired_at) and moved and status.state is RunState.FAILED
    if metrics is not None:
        metrics.end_run(spec.run_id)
    return {
        "canary": canary.name, "expected": canary.expected or "(none: must stay quiet)",
        "fired_at": fired_at, "paged": paged, "states": sup.machine.labels(), "state": status.label,
        "reason": status.reason, "steps_run": sup.steps, "wall_s": time.perf_counter() - t0, "ok": ok,
        "error": f"{type(error).__name__}: {error}" if error else "",
    }
