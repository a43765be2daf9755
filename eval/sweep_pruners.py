"""Every pruner a sweep spec can name (`pruning: {detector: NAME, params: {...}}`), built in one place:

- `incumbent`: `eval.incumbent_pruner.IncumbentPruner`, paired per-prompt evidence against the best checkpoint
  another trial recorded, with a stated error rate (params: alpha, margin, window, n_warmup_steps, min_prompts,
  min_history);
- `median`, `wilcoxon`: Optuna's `MedianPruner` and `WilcoxonPruner` on the trials' intermediate values (the best
  checkpoint score so far; Optuna's own defaults unless params say otherwise), for comparison;
- `none`: no pruning;
- any other name: one of the platform's early-stop detectors (`eval.optuna_pruner.DetectorPruner`; `default` is
  the platform's default detector).

Each pruner has a `name` (what a stop reason names) and `reason(study, trial)` (the evidence behind a prune, as a
tenant reads it). `replay` runs a pruner over a recorded unpruned sweep (what `rlhfops bench sweep-replay` reports).
No Prefect, MLflow or CLI.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import optuna
from optuna.pruners import BasePruner

#: the pruner names a spec may give besides the detectors'
PRUNERS = ("incumbent", "median", "wilcoxon", "none")


class MedianPruner(optuna.pruners.MedianPruner):
    """Optuna's `MedianPruner`, named."""

    name = "median"

    def reason(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> str:
        return (f"its best score so far at step {trial.last_step} is below the median of earlier trials' at the "
                "same step")


class WilcoxonPruner(optuna.pruners.WilcoxonPruner):
    """Optuna's `WilcoxonPruner`, named (steps are its instances: the best score so far at each step, paired with
    the best trial's at the same steps)."""

    name = "wilcoxon"

    def reason(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> str:
        return (f"Wilcoxon signed-rank test: its scores at steps up to {trial.last_step} are below the best trial's "
                "at the same steps")


def make_pruner(name: str, params: Mapping[str, Any] | None = None) -> BasePruner:
    """The pruner `name` with `params` (ValueError naming a wrong name or parameter)."""
    params = dict(params or {})
    key = (name or "default").lower()
    if key == "none":
        return optuna.pruners.NopPruner()
    if key == "incumbent":
        from eval.incumbent_pruner import make

        return make(params)
    if key in ("median", "wilcoxon"):
        cls = MedianPruner if key == "median" else WilcoxonPruner
        try:
            return cls(**params)
        except TypeError as err:
            raise ValueError(f"{key} pruner: {err}") from None
    from eval.optuna_pruner import DetectorPruner

    return DetectorPruner(name, **params)


def stop_reason(pruner: Any, study: optuna.Study, trial: Any, step: int) -> str:
    """What a pruned trial's record says: the pruner's name, the step, and its evidence when it gives one."""
    name = getattr(pruner, "name", type(pruner).__name__)
    text = f"pruned by the {name} pruner at step {step}"
    explain = getattr(pruner, "reason", None)
    if explain is None:
        return text
    try:
        frozen = study._storage.get_trial(trial._trial_id) if isinstance(trial, optuna.Trial) else trial
        return f"{text}: {explain(study, frozen)}"
    except Exception:  # noqa: BLE001 - the evidence is a courtesy; the prune itself already happened
        return text


@dataclass(frozen=True)
class RecordedTrial:
    """One trial of an unpruned sweep as recorded (one seed): its number, its checkpoints' per-prompt held-out
    scores in step order, and each step's GPU-seconds."""

    number: int
    checkpoints: list[tuple[int, dict[str, float]]]
    step_seconds: dict[int, float] = field(default_factory=dict)


def replay(trials: list[RecordedTrial], pruner: BasePruner, slots: int = 1) -> dict[str, Any]:
    """What `pruner` would have done to a recorded unpruned sweep: the trials start in number order on `slots` slots,
    time runs on the recorded GPU-seconds of each step, each checkpoint is reported to a fresh in-memory study
    (`report_checkpoint`, keeping the highest score as sweep trials do) and the pruner is asked, as the sweep runner
    asks it. Training is deterministic, so a pruned trial's checkpoints are the first ones of its recorded run.
    Returns steps trained, GPU-seconds, trials pruned, the best kept score and trial, and each trial's outcome."""
    from optuna.trial import TrialState

    from eval.optuna_pruner import best_value, report_checkpoint

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="maximize", pruner=pruner)
    queue = sorted(trials, key=lambda t: t.number)
    running: dict[int, dict[str, Any]] = {}
    out: dict[int, dict[str, Any]] = {}

    def cost(t: RecordedTrial, a: int, b: int) -> float:  # GPU-seconds of steps a+1..b
        return sum(t.step_seconds.get(s, 0.0) for s in range(a + 1, b + 1))

    def start(now: float) -> None:
        while queue and len(running) < slots:
            t = queue.pop(0)
            running[t.number] = {"rec": t, "trial": study.ask(), "k": 0, "step": 0, "time": now}

    start(0.0)
    while running:
        def next_time(r: dict[str, Any]) -> float:
            return r["time"] + cost(r["rec"], r["step"], r["rec"].checkpoints[r["k"]][0])

        number = min(running, key=lambda n: (next_time(running[n]), n))
        r = running[number]
        rec, now = r["rec"], next_time(r)
        step, scores = rec.checkpoints[r["k"]]
        r.update(time=now, step=step, k=r["k"] + 1)
        mean = float(np.mean(list(scores.values())))
        report_checkpoint(r["trial"], step, mean, prompts=scores, planned_checkpoints=len(rec.checkpoints),
                          keep="highest")
        last = r["k"] >= len(rec.checkpoints)
        pruned = not last and pruner.prune(study, study._storage.get_trial(r["trial"]._trial_id))
        if pruned or last:
            kept = best_value(r["trial"])
            if pruned:
                study.tell(r["trial"], state=TrialState.PRUNED)
            else:
                study.tell(r["trial"], kept)
            out[number] = {"steps": step, "kept": kept, "pruned": pruned, "gpu_seconds": cost(rec, 0, step)}
            del running[number]
            start(now)
    best = max(out, key=lambda n: (out[n]["kept"], -n)) if out else None
    return {"steps_trained": sum(o["steps"] for o in out.values()),
            "gpu_seconds": sum(o["gpu_seconds"] for o in out.values()),
            "trials_pruned": sum(o["pruned"] for o in out.values()),
            "best_score": out[best]["kept"] if best is not None else float("nan"), "best_trial": best,
            "per_trial": out}
