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
tenant reads it). No Prefect, MLflow or CLI.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

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
