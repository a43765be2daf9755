"""The platform's early-stop detectors as an Optuna pruner: reward-hacking-aware pruning that keeps the best
checkpoint.

Optuna's pruners (median, Hyperband, ...) compare a trial's last reported value with other trials'. An RLHF run
that over-optimises its proxy reward looks fine to them until late: its reward keeps rising, and the held-out score
it reports falls only after the damage is done. The platform's detectors (eval/detectors.py) read a run's own
checkpoint series (held-out score, the gate's standard error, the proxy reward) and stop it when quality turns
down while the proxy still climbs; the run keeps its best checkpoint. This adapter gives any Optuna user that:

    pruner = DetectorPruner("divergence")
    study = optuna.create_study(direction="maximize", pruner=pruner)

    def objective(trial):
        for step in ...:
            score, se, reward = evaluate()
            report_checkpoint(trial, step, score, se=se, reward=reward)   # instead of trial.report
            if trial.should_prune():
                raise optuna.TrialPruned()      # the trial's value is its best checkpoint's score
        return best_value(trial)

`report_checkpoint` records the raw checkpoint (score, SE, proxy reward) as a trial user attribute, which the
detector reads, and reports the best score so far as Optuna's intermediate value: Optuna gives a pruned trial its
last intermediate value, so a pruned run is valued by the checkpoint it keeps, not by the declined one it stopped
at. A trial that reports with plain `trial.report` still works: the detector then sees the reported values alone
(no SE, no proxy reward: the detectors that need the reward do not fire on reward hacking without it).

Stateless between calls (the detector's monitor is rebuilt from the stored series on every `prune`), so it works
with any storage and from any process, as Optuna requires. No Prefect, MLflow or CLI.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import optuna
from optuna.pruners import BasePruner
from optuna.study import StudyDirection
from optuna.trial import FrozenTrial

from eval.detectors import DEFAULT_DETECTOR, Checkpoint, Detector, make_detector

#: user attribute keys of the raw checkpoints: `rlhfops.ckpt.<step, zero-padded>` -> {score, se, reward, series}
CKPT_PREFIX = "rlhfops.ckpt."
#: user attribute key of the number of checkpoints each series of a trial plans to report
PLANNED_KEY = "rlhfops.planned_checkpoints"
#: user attribute key of which checkpoint the trial keeps: "highest" or "lowest" score (absent: the study's direction)
KEEP_KEY = "rlhfops.keep"
NAN = float("nan")


def _f(x: Any) -> float:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return NAN
    return v


def report_checkpoint(trial: optuna.Trial, step: int, score: float, *, se: float = NAN, reward: float = NAN,
                      series: int = 0, prompts: Mapping[Any, float] | None = None,
                      planned_checkpoints: int | None = None, keep: str | None = None) -> float:
    """Record one checkpoint of `trial` (the held-out `score`, its standard error `se`, the proxy `reward` at that
    step; `series` numbers independent curves within one trial, e.g. seeds trained one after another) and report the
    best score so far (in the study's direction) as Optuna's intermediate value at `step`. Returns that best.

    `prompts`: the checkpoint's per-prompt held-out scores, {prompt id: score}, sampled with the run's fixed
    sampling seed (the gate's common random numbers); `eval.incumbent_pruner.IncumbentPruner` pairs them with the
    incumbent trial's scores on the same prompts. `planned_checkpoints`: how many checkpoints each series of the
    trial will report if it runs to the end (the pruner spends its error rate over them). `keep`: which checkpoint
    the trial keeps, "highest" or "lowest" score (default: the best in the study's direction); a sweep trial keeps its
    highest held-out score in either direction (`training.job.lifecycle.best_of`) and says so, so that the value Optuna
    and every pruner see is the checkpoint the trial really keeps."""
    if keep not in (None, "highest", "lowest"):
        raise ValueError(f"keep must be 'highest' or 'lowest', got {keep!r}")
    if keep is not None and KEEP_KEY not in trial.user_attrs:
        trial.set_user_attr(KEEP_KEY, keep)
    step = int(step)
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    attr: dict[str, Any] = {"score": _f(score), "se": _f(se), "reward": _f(reward), "series": int(series)}
    if prompts:
        attr["prompts"] = {str(k): _f(v) for k, v in prompts.items()}
    if planned_checkpoints is not None and PLANNED_KEY not in trial.user_attrs:
        trial.set_user_attr(PLANNED_KEY, int(planned_checkpoints))
    trial.set_user_attr(f"{CKPT_PREFIX}{step:09d}", attr)
    best = best_checkpoint_of(trial.study.direction, reported_checkpoints(trial.user_attrs), series,
                              highest=keeps_highest(trial.user_attrs, trial.study.direction))
    value = best[1] if best is not None else _f(score)
    trial.report(value, step)
    return value


def reported_checkpoints(attrs: Mapping[str, Any]) -> list[tuple[int, dict[str, Any]]]:
    """(step, checkpoint record) of everything `report_checkpoint` stored in a trial's user attributes, in step
    order."""
    out = []
    for key, value in attrs.items():
        if key.startswith(CKPT_PREFIX) and isinstance(value, dict):
            out.append((int(key[len(CKPT_PREFIX):]), value))
    return sorted(out)


def keeps_highest(attrs: Mapping[str, Any], direction: StudyDirection) -> bool:
    """Whether a trial (its user attributes) keeps its highest-scoring checkpoint: as `report_checkpoint(...,
    keep=)` recorded, else the study's direction."""
    keep = attrs.get(KEEP_KEY)
    if keep is not None:
        return keep == "highest"
    return direction != StudyDirection.MINIMIZE


def best_checkpoint_of(direction: StudyDirection, checkpoints: list[tuple[int, dict[str, float]]],
                       series: int | None = None, highest: bool | None = None) -> tuple[int, float, float] | None:
    """(step, score, se) of the best finite checkpoint (of `series`, or of all): the highest score when `highest`
    (default: the study's direction says which); ties go to the earlier step (less optimisation pressure). None when
    there is none."""
    if highest is None:
        highest = direction != StudyDirection.MINIMIZE
    sign = 1.0 if highest else -1.0
    best = None
    for step, c in checkpoints:
        if series is not None and int(c.get("series", 0)) != series:
            continue
        s = _f(c.get("score"))
        if not math.isfinite(s):
            continue
        if best is None or sign * s > sign * best[1]:
            best = (step, s, _f(c.get("se")))
    return best


def best_value(trial: optuna.Trial | FrozenTrial) -> float:
    """The trial's best checkpoint score over everything it reported with `report_checkpoint` (NaN if nothing)."""
    direction = trial.study.direction if isinstance(trial, optuna.Trial) else StudyDirection.MAXIMIZE
    best = best_checkpoint_of(direction, reported_checkpoints(trial.user_attrs),
                              highest=keeps_highest(trial.user_attrs, direction))
    return best[1] if best is not None else NAN


class DetectorPruner(BasePruner):
    """Prune a trial when one of the platform's early-stop detectors says its run should stop.

    `detector`: a registry name (`eval.registry.EARLY_STOP_DETECTORS`; "default" is the platform's default, the one
    the live platform gates jobs with) or a built `Detector`; `params` go to `make_detector` over the calibrated
    thresholds.
    `n_warmup_steps`: never prune before this step. The detector sees the trial's latest series only (a new series,
    e.g. the next seed, starts a fresh detector state). Works with `report_checkpoint` (score, SE, proxy reward) and
    with plain `trial.report` (the values alone).

    In a minimizing study the scores are negated before the detector sees them: detectors read higher as better."""

    def __init__(self, detector: str | Detector = "default", n_warmup_steps: int = 0, **params: Any) -> None:
        if isinstance(detector, Detector):
            if params:
                raise ValueError("params apply to a detector named by string, not to a built one")
            self.detector = detector
        else:
            name = DEFAULT_DETECTOR if detector in ("default", "", None) else detector
            self.detector = make_detector(name, **params)
        if n_warmup_steps < 0:
            raise ValueError(f"n_warmup_steps must be >= 0, got {n_warmup_steps}")
        self.n_warmup_steps = n_warmup_steps

    @property
    def name(self) -> str:
        return self.detector.name

    def checkpoints(self, trial: FrozenTrial) -> list[tuple[Checkpoint, dict[str, float] | None]]:
        """What the detector sees of `trial`: its latest series' checkpoints in step order, each with its per-prompt
        scores ({prompt id: score}) when `report_checkpoint` recorded them, else None."""
        raw = reported_checkpoints(trial.user_attrs)
        if raw:
            latest = int(raw[-1][1].get("series", 0))
            return [(Checkpoint(step=float(step), eval_score=_f(c.get("score")), eval_se=_f(c.get("se")),
                                reward=_f(c.get("reward"))), c.get("prompts") or None)
                    for step, c in raw if int(c.get("series", 0)) == latest]
        return [(Checkpoint(step=float(step), eval_score=float(v)), None)
                for step, v in sorted(trial.intermediate_values.items())]

    def stop_step(self, trial: FrozenTrial, sign: float = 1.0) -> int | None:
        """The step at which the detector stops the trial's latest series, or None. A detector that decides on
        per-prompt scores (the paired rule) gets each checkpoint's; without them it never stops, as on a live run."""
        monitor = self.detector.start()
        per_prompt = "prompt_scores" in getattr(self.detector, "needs", ())
        for cp, prompts in self.checkpoints(trial):
            if not math.isfinite(cp.eval_score):
                continue
            if sign < 0:
                cp.eval_score = -cp.eval_score
            if per_prompt:
                scores = None if prompts is None else {k: sign * _f(v) for k, v in prompts.items()}
                stop = monitor.observe(cp, scores)
            else:
                stop = monitor.observe(cp)
            if stop and cp.step >= self.n_warmup_steps:
                return int(cp.step)
        return None

    def prune(self, study: optuna.Study, trial: FrozenTrial) -> bool:
        if trial.last_step is None or trial.last_step < self.n_warmup_steps:
            return False
        sign = -1.0 if study.direction == StudyDirection.MINIMIZE else 1.0
        return self.stop_step(trial, sign) is not None
