"""A sweep pruner that asks the sweep's question: can this trial still beat the incumbent?

A live run asks "is this run declining?"; a sweep asks whether a trial can still deliver a better checkpoint than
the best trial finished so far (the incumbent). Optuna's `MedianPruner` and `WilcoxonPruner` answer with a rank or a
p-value over means, with no error rate a user can rely on. This pruner answers on paired evidence: every trial
reports, at each checkpoint, its per-prompt held-out scores, sampled on the same prompts with the same sampling seed
(the gate's common random numbers, `eval.optuna_pruner.report_checkpoint(..., prompts=...)`), so the per-prompt
difference of two checkpoints cancels prompt difficulty and most sampling noise.

The rule (scores in the study's direction; `margin` m: the least improvement on the incumbent that makes a trial
worth finishing, default 0). A pruned trial keeps its best checkpoint (Optuna values it by the best score it
reported), so what pruning gives up is only the trial's future checkpoints. At a checkpoint at step s (s >=
`n_warmup_steps`) the trial is pruned when both hold:

1. **it is not at the incumbent's level now**: the upper confidence bound of the mean paired difference between the
   trial at s and the incumbent's best checkpoint (its value), on the same prompts, is below m;
2. **it is not keeping pace with the incumbent**: the upper bound of the mean paired difference between the trial at
   s and the incumbent at the same step (its checkpoint at the largest step <= s) is below m. (A trial that learns
   as fast as the incumbent did may still overtake it; one behind the incumbent's own curve is not catching up.)

Each bound is a one-sided upper confidence bound on the mean paired difference over the gate's n prompts (Student's
t on the per-prompt differences of `eval.paired.paired_diff`: a checkpoint is compared on the fixed set of prompts
its gate scored, so a fixed-n bound is the tight one), and alpha is spent over the looks so that every bound a trial
will ever see holds at once with probability >= 1 - alpha (a union bound): alpha / K at each look when the trial's
planned number of checkpoints K is known (`report_checkpoint(..., planned_checkpoints=K)`, which the sweep runner
gives), else alpha / (k (k + 1)) at the k-th look after the warm-up (the a_k sum to alpha for any number of looks).
The incumbent's checkpoints are the references: a fixed best one (condition 1) and one per step (condition 2); the
choice of the incumbent among the finished trials is a selection on the same kind of scores, and the simulation
includes it.

**Error rate.** Given the incumbent, a trial whose true mean (over the gate's prompts, at the run's sampling seed)
at every checkpoint it is looked at is at least the incumbent's at the same step plus m (it keeps pace), or at least
the incumbent's best plus m (it is already as good), is pruned with probability at most alpha, however many
checkpoints it reports. The incumbent is itself chosen as the best finished trial on noisy scores, a selection the
bounds do not see: with the incumbent the best of 4 trials as good as the challenger, the simulation measures 1.8%
(open-ended spending) and 2.3% (planned) at alpha = 2%. What no pruner can cover: a trial truly behind on both
counts now that would overtake the incumbent later; `n_warmup_steps` is the knob for that.
`tests/eval/test_incumbent_pruner.py` checks these rates by simulation and the power against trials that are truly
worse.

Until the first trial completes there is no incumbent and nothing is pruned. Stateless (everything is read from the
trials' user attributes), so it works with any Optuna storage and from any process. No Prefect, MLflow or CLI.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np
import optuna
from optuna.pruners import BasePruner
from optuna.study import StudyDirection
from optuna.trial import FrozenTrial, TrialState

from eval.optuna_pruner import PLANNED_KEY, reported_checkpoints

#: a checkpoint's per-prompt scores: {prompt id: score}
PromptScores = Mapping[str, float]


def look_level(alpha: float, k: int, planned: int | None = None) -> float:
    """The level spent at the k-th look (k >= 1): alpha / planned when the number of looks is planned (0 past it),
    else alpha / (k (k + 1)); summed over every look, alpha either way."""
    if planned:
        return alpha / planned if k <= planned else 0.0
    return alpha / (k * (k + 1))


def upper_bound(diffs: np.ndarray, level: float) -> float:
    """One-sided (1 - `level`) upper confidence bound of the mean of paired differences: mean + t(1 - level, n - 1)
    SD / sqrt(n) (n, mean, SD from `eval.paired.paired_diff`). inf with fewer than 2 differences or a level of 0;
    the mean itself when every difference is the same."""
    from eval.paired import paired_diff

    d = np.asarray(diffs, dtype=float)
    d = d[np.isfinite(d)]
    if len(d) < 2 or level <= 0:
        return math.inf
    pd = paired_diff(np.zeros_like(d), d)
    return pd.mean + (_t_quantile(1.0 - level, pd.n - 1) * pd.sd / math.sqrt(pd.n) if pd.sd > 0 else 0.0)


@lru_cache(maxsize=4096)
def _t_quantile(q: float, df: int) -> float:
    from scipy import stats

    return float(stats.t.ppf(q, df))


def paired(a: PromptScores, b: PromptScores) -> np.ndarray:
    """a - b on the prompts both scored (in prompt-id order)."""
    common = sorted(set(a) & set(b))
    return np.array([float(a[p]) - float(b[p]) for p in common], dtype=float)


def mean_of(scores: PromptScores) -> float:
    vals = [float(v) for v in scores.values() if math.isfinite(float(v))]
    return float(np.mean(vals)) if vals else -math.inf


@dataclass(frozen=True)
class Decision:
    """Why a trial was (or was not) pruned at its latest checkpoint (`step`, its `look`-th look): `diff_best` and
    `best_upper` are the mean paired difference (trial - incumbent's best checkpoint) and its upper bound,
    `diff_pace`/`pace_upper` the same against the incumbent at the same step, `n` the prompts paired."""

    prune: bool
    step: int
    look: int
    best_upper: float
    pace_upper: float
    diff_best: float
    diff_pace: float
    n: int
    incumbent_step: int | None = None
    pace_step: int | None = None

    def reason(self, margin: float, alpha: float) -> str:
        return (f"cannot beat the incumbent by {margin:g} (alpha {alpha:g}): at step {self.step}, {self.n} prompts "
                f"paired, vs its best (step {self.incumbent_step}) {self.diff_best:+.4f} (upper {self.best_upper:+.4f})"
                f", vs its step {self.pace_step} {self.diff_pace:+.4f} (upper {self.pace_upper:+.4f})")


def decide(trial: list[tuple[int, PromptScores]], incumbent: list[tuple[int, PromptScores]], *,
           alpha: float = 0.02, margin: float = 0.0, n_warmup_steps: int = 0, min_prompts: int = 8,
           planned: int | None = None) -> Decision:
    """The rule on plain data: `trial` and `incumbent` are (step, per-prompt scores) in step order, scores in the
    higher-is-better direction; the decision is at the trial's last checkpoint, its k-th look (k: its checkpoints
    at steps >= `n_warmup_steps` so far), at level `look_level(alpha, k, planned)` for both comparisons (`planned`:
    the trial's planned number of checkpoints, when known)."""
    nan = math.nan
    if not trial or not incumbent:
        return Decision(False, trial[-1][0] if trial else -1, 0, nan, nan, nan, nan, 0)
    step, current = int(trial[-1][0]), trial[-1][1]
    looks = sum(1 for s, _ in trial if s >= n_warmup_steps)
    level = look_level(alpha, max(looks, 1), planned)

    def against(ref: PromptScores) -> tuple[float, float, int]:
        d = paired(current, ref)
        if len(d) < min_prompts:
            return math.inf, nan, len(d)
        return upper_bound(d, level), float(d.mean()), len(d)

    # 1. the incumbent's best checkpoint (its value): can the trial's present checkpoint beat it?
    best_step, best = max(incumbent, key=lambda c: (mean_of(c[1]), -c[0]))
    best_upper, diff_best, n = against(best)
    # 2. the incumbent at the same step (its checkpoint at the largest step <= this one): is the trial keeping pace?
    earlier = [c for c in incumbent if c[0] <= step]
    pace_upper, diff_pace, pace_step = math.inf, nan, None
    if earlier:
        pace_step = int(earlier[-1][0])
        pace_upper, diff_pace, _ = against(earlier[-1][1])
    prune = looks >= 1 and step >= n_warmup_steps and best_upper < margin and pace_upper < margin
    return Decision(prune, step, looks, best_upper, pace_upper, diff_best, diff_pace, n, int(best_step), pace_step)


class IncumbentPruner(BasePruner):
    """Prune a trial when its paired per-prompt evidence says it cannot beat the incumbent (the best COMPLETE trial
    so far) by `margin`, at level `alpha` (see the module docstring for the rule and its error rate). Trials report
    with `eval.optuna_pruner.report_checkpoint(trial, step, score, prompts={id: score}, series=...)`; a trial
    without per-prompt records is never pruned. `n_warmup_steps`: never prune before this step. `min_prompts`: the
    fewest prompts paired for a bound to count."""

    def __init__(self, alpha: float = 0.02, margin: float = 0.0, n_warmup_steps: int = 0, min_prompts: int = 8):
        if not 0 < alpha < 1:
            raise ValueError(f"alpha must be in (0, 1), got {alpha}")
        if not math.isfinite(margin):
            raise ValueError(f"margin must be a finite number, got {margin}")
        if n_warmup_steps < 0:
            raise ValueError(f"n_warmup_steps must be >= 0, got {n_warmup_steps}")
        if min_prompts < 2:
            raise ValueError(f"min_prompts must be >= 2, got {min_prompts}")
        self.alpha, self.margin, self.n_warmup_steps, self.min_prompts = alpha, margin, n_warmup_steps, min_prompts

    @property
    def name(self) -> str:
        return "incumbent"

    @staticmethod
    def series_of(trial: FrozenTrial, series: int | None, sign: float) -> list[tuple[int, dict[str, float]]]:
        """(step, per-prompt scores in the maximising direction) of one series of `trial` (None: its latest)."""
        raw = [(s, c) for s, c in reported_checkpoints(trial.user_attrs) if c.get("prompts")]
        if not raw:
            return []
        if series is None:
            series = int(raw[-1][1].get("series", 0))
        return [(s, {p: sign * float(v) for p, v in c["prompts"].items()})
                for s, c in raw if int(c.get("series", 0)) == series]

    def incumbent(self, study: optuna.Study, exclude: int | None = None) -> FrozenTrial | None:
        """The best COMPLETE trial (by value) that reported per-prompt scores."""
        done = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
                if t.number != exclude and t.value is not None and math.isfinite(t.value)
                and any(c.get("prompts") for _, c in reported_checkpoints(t.user_attrs))]
        if not done:
            return None
        sign = -1.0 if study.direction == StudyDirection.MINIMIZE else 1.0
        return max(done, key=lambda t: (sign * float(t.value), -t.number))

    def decision(self, study: optuna.Study, trial: FrozenTrial) -> Decision | None:
        """The rule's verdict at `trial`'s latest checkpoint (None: no incumbent or no per-prompt records)."""
        sign = -1.0 if study.direction == StudyDirection.MINIMIZE else 1.0
        mine = self.series_of(trial, None, sign)
        if not mine:
            return None
        inc = self.incumbent(study, exclude=trial.number)
        if inc is None:
            return None
        series = int(reported_checkpoints(trial.user_attrs)[-1][1].get("series", 0))
        theirs = self.series_of(inc, series, sign) or self.series_of(inc, None, sign)
        if not theirs:
            return None
        planned = trial.user_attrs.get(PLANNED_KEY)
        return decide(mine, theirs, alpha=self.alpha, margin=self.margin, n_warmup_steps=self.n_warmup_steps,
                      min_prompts=self.min_prompts, planned=int(planned) if planned else None)

    def reason(self, study: optuna.Study, trial: FrozenTrial) -> str:
        """The evidence behind a prune, as a stop reason a user reads."""
        d = self.decision(study, trial)
        return d.reason(self.margin, self.alpha) if d is not None else "no incumbent"

    def prune(self, study: optuna.Study, trial: FrozenTrial) -> bool:
        if trial.last_step is None or trial.last_step < self.n_warmup_steps:
            return False
        d = self.decision(study, trial)
        return bool(d is not None and d.prune)


def make(params: Mapping[str, Any]) -> IncumbentPruner:
    """An `IncumbentPruner` from a sweep spec's `pruning.params` (ValueError naming a wrong key)."""
    allowed = {"alpha", "margin", "n_warmup_steps", "min_prompts"}
    extra = set(params) - allowed
    if extra:
        raise ValueError(f"unknown parameter '{sorted(extra)[0]}' for the incumbent pruner (allowed: "
                         f"{', '.join(sorted(allowed))})")
    return IncumbentPruner(**dict(params))
