"""A sweep pruner that asks the sweep's question: can this trial still beat the best checkpoint the sweep has?

A live run asks "is this run declining?"; a sweep asks whether a trial can still deliver a better checkpoint than
the best one any other trial has recorded (the reference). Optuna's `MedianPruner` and `WilcoxonPruner` answer with
a rank or a p-value over means, with no error rate a user can rely on. This pruner answers on paired evidence: every
trial reports, at each checkpoint, its per-prompt held-out scores, sampled on the same prompts with the same sampling
seed (the gate's common random numbers, `eval.optuna_pruner.report_checkpoint(..., prompts=...)`), and is compared
prompt by prompt with the reference. A pruned trial keeps its best checkpoint (Optuna values it by the best score it
reported), so what pruning gives up is only the trial's future checkpoints; the rule therefore bounds the trial's
present and allows for the improvement still to come.

**The rule** (scores in the direction the trial keeps its best checkpoint; `margin` m: the least improvement on the
reference that makes a trial worth finishing). At the trial's k-th checkpoint at step s (s >= `n_warmup_steps`):

- the **reference** R is the best checkpoint (highest mean) that any other trial of the study has reported so far,
  finished or still running: a checkpoint the sweep will keep whatever happens next (a running trial keeps its best);
- the trial's **present** is the per-prompt mean of its last `window` checkpoints (fewer at its start): on a plateau,
  three checkpoints carry three times the sampling information of one;
- the **allowance** A(s) is the largest improvement any other trial has shown after step s: the most its
  `window`-checkpoint mean rose from step s to any later checkpoint (at least 0), over every other trial with a
  checkpoint at or before s and one after it; with fewer than `min_history` such trials there is no estimate and
  nothing is pruned;
- the trial is pruned when U + A(s) < m, U the one-sided upper confidence bound, at level a_k, of the mean over the
  gate's prompts of the paired difference (present - R): Student's t on the per-prompt differences
  (`eval.paired.paired_diff`; a checkpoint is compared on the prompts its gate scored). a_k = alpha / K when the
  trial's planned number of checkpoints K is known (`report_checkpoint(..., planned_checkpoints=K)`, which the sweep
  runner gives), else alpha / (k (k + 1)); summed over any number of looks, alpha.

**What alpha bounds.** Call a trial *able to beat the reference* when a checkpoint it has not reached yet has a true
mean (expectation over the gate's sampling) of at least R's recorded mean + m, and *no faster than the history*
when its true improvement after every look is at most that look's allowance. Such a trial is pruned with
probability at most alpha, however many checkpoints it reports and whichever recorded checkpoint is the reference:
a prune needs U + A(s) < m, hence (when the bound holds) a true present below R + m - A(s), hence every later
checkpoint below R + m; and the bounds all hold at once with probability >= 1 - alpha (a union bound). The reference
is conditioned on (its recorded scores are fixed numbers), so choosing it as a maximum over many noisy checkpoints
does not break the statement; it makes the bar the one the sweep itself ranks by. What is assumed, not guaranteed:
the no-faster-than-history condition (`tests/eval/test_incumbent_pruner.py` measures the rate by simulation with
trials drawn from the same family of curves as their history, and checks the power on trials truly worse).

Until `min_history` other trials have data past a step nothing is pruned at that step. In a study whose direction
disagrees with how its trials keep checkpoints (a minimising sweep of trials that keep their highest held-out score,
as `sweeps.runner` trials do), a trial's value can only get worse with more checkpoints: it is pruned as soon as its
kept value so far is no better than a finished trial's value by m (a certainty, no alpha spent). Stateless
(everything is read from the trials' user attributes), so it works with any Optuna storage and from any process.
No Prefect, MLflow or CLI.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np
import optuna
from optuna.pruners import BasePruner
from optuna.study import StudyDirection
from optuna.trial import FrozenTrial, TrialState

from eval.optuna_pruner import PLANNED_KEY, keeps_highest, reported_checkpoints

#: a checkpoint's per-prompt scores: {prompt id: score}
PromptScores = Mapping[str, float]
#: one trial's checkpoints: (step, per-prompt scores) in step order
Series = Sequence[tuple[int, PromptScores]]


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


def present(series: Series, window: int) -> dict[str, float]:
    """The per-prompt mean of the last `window` checkpoints of `series` (on the prompts all of them scored)."""
    last = [c for _, c in series[-window:]]
    common = set(last[0]).intersection(*last[1:]) if last else set()
    return {p: float(np.mean([float(c[p]) for c in last])) for p in sorted(common)}


def allowance(others: Sequence[Series], step: int, window: int, min_history: int) -> float | None:
    """The largest improvement another trial showed after `step`: the most its `window`-checkpoint mean rose from
    its last checkpoint at or before `step` to any later one (>= 0), over the trials with checkpoints on both sides;
    None with fewer than `min_history` of them."""
    gains = []
    for series in others:
        means = [mean_of(c) for _, c in series]
        smooth = [float(np.mean(means[max(0, i - window + 1): i + 1])) for i in range(len(means))]
        before = [i for i, (s, _) in enumerate(series) if s <= step]
        if not before or before[-1] + 1 >= len(series):
            continue
        i = before[-1]
        gains.append(max(0.0, max(smooth[i + 1:]) - smooth[i]))
    return max(gains) if len(gains) >= max(min_history, 1) else None


@dataclass(frozen=True)
class Decision:
    """Why a trial was (or was not) pruned at its latest checkpoint (`step`, its `look`-th look at `level`): `diff`
    and `upper` are the mean paired difference (its present - the reference) and its upper bound over `n` prompts,
    `allowance` the improvement still allowed for (None: too little history), the reference `reference_trial`'s
    checkpoint at `reference_step` with mean `reference_score`."""

    prune: bool
    step: int
    look: int
    level: float
    diff: float
    upper: float
    allowance: float | None
    n: int
    reference_trial: int | None = None
    reference_step: int | None = None
    reference_score: float = math.nan

    @property
    def incumbent_step(self) -> int | None:
        """The reference checkpoint's step (its trial was the incumbent)."""
        return self.reference_step

    def reason(self, margin: float, alpha: float) -> str:
        allow = "none (too little history)" if self.allowance is None else f"{self.allowance:+.4f}"
        return (f"cannot beat the sweep's best checkpoint by {margin:g} (alpha {alpha:g}): at step {self.step}, "
                f"{self.n} prompts paired with trial {self.reference_trial}'s step {self.reference_step} "
                f"({self.reference_score:+.4f}): {self.diff:+.4f} (upper {self.upper:+.4f}), improvement still "
                f"allowed {allow}")


def best_checkpoint(series: Series) -> tuple[int, PromptScores]:
    """The checkpoint of highest per-prompt mean; ties go to the earlier step (less optimisation pressure)."""
    return max(series, key=lambda c: (mean_of(c[1]), -c[0]))


def decide(trial: Series, reference: PromptScores | Series, others: Sequence[Series] = (), *, alpha: float = 0.05,
           margin: float = 0.0, window: int = 3, n_warmup_steps: int = 0, min_prompts: int = 8,
           min_history: int = 2, planned: int | None = None) -> Decision:
    """The rule on plain data (scores in the higher-is-better direction): `trial` is the trial's checkpoints so far,
    `reference` the per-prompt scores of the best checkpoint another trial recorded (or that trial's checkpoints,
    whose `best_checkpoint` is then the reference), `others` the other trials' checkpoints (the allowance's history);
    the decision is at the trial's last checkpoint, its k-th look (k: its checkpoints at steps >= `n_warmup_steps`),
    at level `look_level(alpha, k, planned)`."""
    nan = math.nan
    ref_step = None
    if reference and not isinstance(reference, Mapping):
        ref_step, reference = best_checkpoint(reference)
        ref_step = int(ref_step)
    if not trial or not reference:
        return Decision(False, int(trial[-1][0]) if trial else -1, 0, nan, nan, nan, None, 0, None, ref_step)
    step = int(trial[-1][0])
    looks = sum(1 for s, _ in trial if s >= n_warmup_steps)
    level = look_level(alpha, max(looks, 1), planned)
    d = paired(present(trial, window), reference)
    allow = allowance(others, step, window, min_history)
    if len(d) < min_prompts:
        return Decision(False, step, looks, level, nan, math.inf, allow, len(d), None, ref_step, mean_of(reference))
    upper = upper_bound(d, level)
    # at its last planned checkpoint a trial has nothing left to save: it ends as it is
    last = planned is not None and len(trial) >= planned
    prune = looks >= 1 and step >= n_warmup_steps and not last and allow is not None and upper + allow < margin
    return Decision(prune, step, looks, level, float(d.mean()), upper, allow, len(d), None, ref_step,
                    mean_of(reference))


class IncumbentPruner(BasePruner):
    """Prune a trial when its paired per-prompt evidence says it cannot beat the best checkpoint any other trial has
    recorded by `margin`, at level `alpha`, allowing for the largest improvement other trials showed after the same
    step (see the module docstring for the rule and what alpha bounds). Trials report with
    `eval.optuna_pruner.report_checkpoint(trial, step, score, prompts={id: score}, series=...)`; a trial without
    per-prompt records is never pruned. `window`: checkpoints averaged into the trial's present; `n_warmup_steps`:
    never prune before this step; `min_prompts`: the fewest prompts paired for a bound to count; `min_history`: the
    fewest other trials with checkpoints past a step for the allowance there."""

    def __init__(self, alpha: float = 0.05, margin: float = 0.0, window: int = 3, n_warmup_steps: int = 0,
                 min_prompts: int = 8, min_history: int = 2):
        if not 0 < alpha < 1:
            raise ValueError(f"alpha must be in (0, 1), got {alpha}")
        if not math.isfinite(margin):
            raise ValueError(f"margin must be a finite number, got {margin}")
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        if n_warmup_steps < 0:
            raise ValueError(f"n_warmup_steps must be >= 0, got {n_warmup_steps}")
        if min_prompts < 2:
            raise ValueError(f"min_prompts must be >= 2, got {min_prompts}")
        if min_history < 1:
            raise ValueError(f"min_history must be >= 1, got {min_history}")
        self.alpha, self.margin, self.window = alpha, margin, window
        self.n_warmup_steps, self.min_prompts, self.min_history = n_warmup_steps, min_prompts, min_history

    @property
    def name(self) -> str:
        return "incumbent"

    @staticmethod
    def series_of(trial: FrozenTrial, series: int | None, sign: float) -> list[tuple[int, dict[str, float]]]:
        """(step, per-prompt scores times `sign`) of one series of `trial` (None: its latest)."""
        raw = [(s, c) for s, c in reported_checkpoints(trial.user_attrs) if c.get("prompts")]
        if not raw:
            return []
        if series is None:
            series = int(raw[-1][1].get("series", 0))
        return [(s, {p: sign * float(v) for p, v in c["prompts"].items()})
                for s, c in raw if int(c.get("series", 0)) == series]

    @staticmethod
    def _sign(trial: FrozenTrial, study: optuna.Study) -> float:
        """+1 when the trial keeps its highest checkpoint, -1 its lowest."""
        return 1.0 if keeps_highest(trial.user_attrs, study.direction) else -1.0

    def incumbent(self, study: optuna.Study, exclude: int | None = None) -> FrozenTrial | None:
        """The best finished trial (COMPLETE, or PRUNED with its kept value) by value."""
        done = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED))
                if t.number != exclude and t.value is not None and math.isfinite(t.value)]
        if not done:
            return None
        sign = -1.0 if study.direction == StudyDirection.MINIMIZE else 1.0
        return max(done, key=lambda t: (sign * float(t.value), -t.number))

    def decision(self, study: optuna.Study, trial: FrozenTrial) -> Decision | None:
        """The rule's verdict at `trial`'s latest checkpoint (None: no reference, or no per-prompt records)."""
        sign = self._sign(trial, study)
        mine = self.series_of(trial, None, sign)
        if not mine:
            return None
        series = int(reported_checkpoints(trial.user_attrs)[-1][1].get("series", 0))
        others = []
        numbers = []
        for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED,
                                                          TrialState.RUNNING)):
            if t.number == trial.number:
                continue
            s = self.series_of(t, series, sign)
            if s:
                others.append(s)
                numbers.append(t.number)
        if not others:
            return None
        # the best checkpoint of all; ties go to the earlier trial, then the earlier step
        ref_i, (ref_step, ref) = max(((i, best_checkpoint(s)) for i, s in enumerate(others)),
                                     key=lambda x: (mean_of(x[1][1]), -numbers[x[0]]))
        planned = trial.user_attrs.get(PLANNED_KEY)
        d = decide(mine, ref, others, alpha=self.alpha, margin=self.margin, window=self.window,
                   n_warmup_steps=self.n_warmup_steps, min_prompts=self.min_prompts, min_history=self.min_history,
                   planned=int(planned) if planned else None)
        return Decision(d.prune, d.step, d.look, d.level, d.diff, d.upper, d.allowance, d.n, numbers[ref_i],
                        int(ref_step), sign * mean_of(ref))

    def _worse_for_ever(self, study: optuna.Study, trial: FrozenTrial) -> str | None:
        """In a study whose direction disagrees with how the trial keeps its checkpoint, the trial's value only gets
        worse: a reason when it is already no better than a finished trial's by the margin, else None."""
        from eval.optuna_pruner import best_value

        inc = self.incumbent(study, exclude=trial.number)
        value = best_value(trial)
        if inc is None or not math.isfinite(value):
            return None
        sign = -1.0 if study.direction == StudyDirection.MINIMIZE else 1.0
        if sign * value <= sign * float(inc.value) + self.margin:
            return (f"its value so far ({value:+.4f}) can only get worse and is not better than trial {inc.number}'s "
                    f"({float(inc.value):+.4f}) by {self.margin:g}")
        return None

    def _direction_agrees(self, study: optuna.Study, trial: FrozenTrial) -> bool:
        return keeps_highest(trial.user_attrs, study.direction) == (study.direction != StudyDirection.MINIMIZE)

    def reason(self, study: optuna.Study, trial: FrozenTrial) -> str:
        """The evidence behind a prune, as a stop reason a user reads."""
        if not self._direction_agrees(study, trial):
            return self._worse_for_ever(study, trial) or "no finished trial to compare with"
        d = self.decision(study, trial)
        return d.reason(self.margin, self.alpha) if d is not None else "no other trial's checkpoints"

    def prune(self, study: optuna.Study, trial: FrozenTrial) -> bool:
        if trial.last_step is None or trial.last_step < self.n_warmup_steps:
            return False
        if not self._direction_agrees(study, trial):
            return self._worse_for_ever(study, trial) is not None
        d = self.decision(study, trial)
        return bool(d is not None and d.prune)


def make(params: Mapping[str, Any]) -> IncumbentPruner:
    """An `IncumbentPruner` from a sweep spec's `pruning.params` (ValueError naming a wrong key)."""
    allowed = {"alpha", "margin", "window", "n_warmup_steps", "min_prompts", "min_history"}
    extra = set(params) - allowed
    if extra:
        raise ValueError(f"unknown parameter '{sorted(extra)[0]}' for the incumbent pruner (allowed: "
                         f"{', '.join(sorted(allowed))})")
    return IncumbentPruner(**dict(params))
