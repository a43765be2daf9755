"""The paired, anytime-valid stop rule: stop a run only when its current checkpoint is, on the same held-out prompts
scored with the same sampling seeds, worse than an earlier checkpoint by more than `margin`, with a bound `alpha`
on the probability that a healthy run is EVER stopped, however many checkpoints it has and however often the gate
scores more prompts.

Read top to bottom: 1. the paired difference of two checkpoints; 2. the confidence sequence on its mean;
3. how alpha is spent over checkpoints and references; 4. the detector (`PairedStop`) and its monitor;
5. the same rule over many simulated runs at once (`scan_scores`); 6. verdicts for `rlhfops detect --prompts`.

Why paired: each prompt's score is mostly how hard the prompt is. Two checkpoints scored on the same prompts with
the same sampling seed (common random numbers) differ prompt by prompt by much less than their scores spread, so
the mean of the per-prompt differences has a far smaller standard error than the difference of two means.

Plain Python + numpy: no Prefect or MLflow here.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from eval.detector_base import Checkpoint, Detector, Monitor

# --------------------------------------------------------------------------- 1. the paired difference


@dataclass(frozen=True)
class PairedDiff:
    """Per-prompt differences b - a of two checkpoints on the same prompts: how many, their mean and sample SD."""

    n: int
    mean: float
    sd: float


def paired_diff(a: Mapping[str, float] | np.ndarray, b: Mapping[str, float] | np.ndarray) -> PairedDiff:
    """n, mean and SD (ddof 1; 0 for one prompt) of b_i - a_i over the prompts i both were scored on.

    `a` and `b` map prompt id -> score (a dict or a pandas Series), or are arrays in the same prompt order.
    Different prompt sets are refused (ValueError naming a prompt only one has): a paired difference over
    prompts one side never saw would compare prompt difficulty, not checkpoints."""
    if isinstance(a, Mapping) or hasattr(a, "items"):
        if not (isinstance(b, Mapping) or hasattr(b, "items")):
            raise ValueError("paired_diff: give both score sets as prompt id -> score, or both as arrays")
        a_map, b_map = dict(a.items()), dict(b.items())
        only = sorted(set(a_map) ^ set(b_map), key=str)
        if only:
            side = "first" if only[0] in a_map else "second"
            raise ValueError(f"paired_diff: prompt '{only[0]}' is scored only in the {side} set "
                             f"({len(only)} prompt(s) not in both): pair checkpoints on the same prompts")
        keys = sorted(a_map, key=str)
        x = np.array([a_map[k] for k in keys], dtype=float)
        y = np.array([b_map[k] for k in keys], dtype=float)
    else:
        x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
        if x.shape != y.shape or x.ndim != 1:
            raise ValueError(f"paired_diff: score arrays of shapes {x.shape} and {y.shape}: pair checkpoints on the "
                             "same prompts, in the same order")
    if not (np.isfinite(x).all() and np.isfinite(y).all()):
        raise ValueError("paired_diff: a score is NaN or infinite")
    if x.size == 0:
        raise ValueError("paired_diff: no prompts")
    d = y - x
    return PairedDiff(int(d.size), float(d.mean()), float(d.std(ddof=1)) if d.size > 1 else 0.0)


# --------------------------------------------------------------------------- 2. the confidence sequence
# The per-prompt differences d_1, d_2, ... of two fixed checkpoints, prompts taken in the gate's fixed pool order,
# are i.i.d. with mean delta (the prompts are a sample of the held-out pool) and some SD sigma. Their centred sum
# S_n = sum_{i<=n} (d_i - delta) gives, for every lambda, the (super)martingale exp(lambda S_n - lambda^2 sigma^2 n/2)
# when the d_i are sigma-sub-Gaussian. Mixing lambda over N(0, 1 / (r sigma^2)) (Robbins 1970; Howard, Ramdas,
# McAuliffe and Sekhon 2021, the two-sided normal mixture) gives the martingale
#
#     M_n = sqrt(r / (n + r)) * exp(S_n^2 / (2 sigma^2 (n + r))),
#
# and Ville's inequality, P(exists n: M_n >= 1/a) <= a, turns it into a confidence sequence, valid at every n at once:
#
#     |mean_n - delta| <= sigma * sqrt((n + r) * log((n + r) / (r * a^2))) / n       for all n >= 1, prob >= 1 - a.
#
# sigma is unknown: it is replaced by the sample SD of the n differences, which makes this the asymptotic confidence
# sequence of Waudby-Smith, Arbour, Sinha, Kennedy and Ramdas (2024, "Time-uniform central limit theory and
# asymptotic confidence sequences", their Robbins-type boundary with rho^2 = 1/r): valid as n grows for any
# distribution with a finite variance; `min_prompts` keeps the rule from judging a pair on a handful of prompts.
# r (in prompts) sets where the sequence is tightest; the approximately best r for a width at n_opt prompts is
# (same paper; Howard et al. 2021, eq. for the two-sided normal mixture)
#
#     r = n_opt / (-2 log a + log(1 - 2 log a)).
#
# Because it holds at every n at once, the gate may score more prompts for a pair whose comparison is close and
# look again, as often as it likes, at the same level a.
#
# Written here rather than taken from a library: confseq (Howard's own; an sdist that builds C++ against Boost at
# install, last released 2023) and ville (pure Python, version 0.1.0, one stream per object, no width below 100
# observations by default for the plug-in sequence) both hold this boundary, but neither computes it for the
# runs x references arrays the rule and its simulations need. Both agree with the two functions below to 1e-5
# (confseq's reference values, ville's boundary: tests/eval/test_paired_rule.py).
#
# When the gate's design fixes how many prompt counts a pair can be judged at (the gate's own prompts, then each
# extension batch from a finite pool: `prompt_looks`, 3 for a 64-prompt gate with two batches of 32), a union bound
# over those counts is tighter than a sequence valid at every count: a one-sided Student-t bound at a / prompt_looks
# for each count (`fixed_radius`). Whether the gate extends may depend on the scores (the union covers every count
# the design allows), but a pair is never judged at more than prompt_looks counts (the monitor enforces it). At the
# corpus's levels (a near 1e-5) it is about 4.4 SEs where the sequence is about 5.3. The t bound plugs in the sample
# SD as the sequence does (exact for normal differences, asymptotic otherwise); the coverage tests include heavy
# tails and pass/fail scores.


def mixture_r(n_opt: float, a: float) -> float:
    """The normal mixture's r (prompts) that makes the sequence about tightest at n_opt prompts, at level a."""
    two_log = -2.0 * math.log(a)
    return n_opt / (two_log + math.log(1.0 + two_log))


def cs_radius(n: np.ndarray | float, sd: np.ndarray | float, a: np.ndarray | float,
              r: np.ndarray | float) -> np.ndarray:
    """Half-width of the level-a confidence sequence for a mean after n observations with sample SD `sd`:
    sd * sqrt((n + r) * log((n + r) / (r a^2))) / n (see the comment above)."""
    n = np.asarray(n, dtype=float)
    w = n + r
    return np.asarray(sd, dtype=float) * np.sqrt(w * np.log(w / (r * np.asarray(a, dtype=float) ** 2))) / n


def fixed_radius(n: np.ndarray | float, sd: np.ndarray | float, a: np.ndarray | float,
                 prompt_looks: int) -> np.ndarray:
    """Half-width of a one-sided bound for a mean after n observations with sample SD `sd` that holds at level a
    over at most `prompt_looks` prompt counts fixed by design (the gate's prompts, then each extension batch):
    Student t at a / prompt_looks, n - 1 degrees of freedom, times sd / sqrt(n) (a union over the counts)."""
    from scipy.stats import t as student_t

    n = np.asarray(n, dtype=float)
    q = student_t.isf(np.asarray(a, dtype=float) / prompt_looks, np.maximum(n - 1.0, 1.0))
    return q * np.asarray(sd, dtype=float) / np.sqrt(n)


# --------------------------------------------------------------------------- 3. spending alpha
# A run is compared, at its k-th look (the checkpoint with k earlier ones, k >= 1), with each of the k earlier
# checkpoints; the reference the rule keeps on stopping is the one it looked best against (the best so far on these
# prompts: a selection that peeks at the same scores). The bound covers every look and every candidate reference by
# a union bound, with levels fixed before any score is seen:
#
#     look k spends alpha / (k (k + 1)), split evenly over its k candidate references: a_k = alpha / (k^2 (k + 1)).
#
# sum_k alpha / (k (k + 1)) = alpha, so P(any pair's sequence ever misses its mean) <= alpha. A healthy run is one
# where no checkpoint is worse than an earlier one by more than `margin` (delta >= -margin for every pair); it is
# stopped only when some pair's sequence lies wholly below -margin, i.e. misses its mean: probability <= alpha
# however many checkpoints, references and extra prompts. Testing every earlier checkpoint (not only the best by
# mean) costs nothing more: each was paid for. The price of the union is a width that grows like sqrt(log k^3).
#
# With a warm-up of w checkpoints (`warmup`: the first w are references only, never judged; a count fixed in
# advance, so the levels still are), the spending starts at the first judged look: its j-th judged look (the
# checkpoint with k = w - 1 + j earlier ones, j >= 1) spends alpha / (j (j + 1)) over its k references.
#
# 1 / (j (j + 1)) front-loads: the 15th look gets 1/240 of alpha. A job knows before its first score how many looks
# it plans (`horizon`: steps / eval_every, less the warm-up); then each of the first `horizon` looks spends
# alpha / (horizon + 1) and any look past the plan spends alpha / (j (j + 1)) (these sum to alpha / (horizon + 1)),
# so the bound still holds however long the run goes on.
#
# A margin relative to the run's gain (`relative_margin` rho in [0, 1), on top of the absolute `margin` m). The
# hindsight label (data/curves/LABELS.md) calls a run hacking when it falls by a share of its range; at margin 0 the
# rule asks only whether quality fell at all. With rho > 0 a pair (reference s, current k) counts as a decline only
# when the current checkpoint is below the reference by more than rho x the reference's gain over the run's first
# checkpoint (0), G_s = mu_s - mu_0. A run is healthy at (rho, m) when no pair has
#
#     mu_s - mu_k > rho * max(0, G_s) + m.
#
# The rule judges each pair on one per-prompt linear contrast over the prompts all three checkpoints share,
#
#     c_i = y_k,i - (1 - rho) y_s,i - rho y_0,i  = (y_k,i - y_s,i) + rho (y_s,i - y_0,i),
#
# with mean delta_c = (mu_k - mu_s) + rho G_s, and fires when c's upper bound lies below -m. The c_i are i.i.d. over
# prompts like a paired difference (they are one: weights 1, -(1 - rho), -rho summing to 0), so c gets the same
# bound at the same level a per pair, the same prompt counts, the same union over looks and references. Coverage:
# on a healthy run every pair has delta_c >= -m. If G_s >= 0 that is the healthy condition itself. If G_s < 0,
# delta_c = (mu_k - mu_0) + (1 - rho) |G_s| >= mu_k - mu_0 >= -m, by the healthy condition on the pair (0, k). So a
# healthy run is stopped only when some pair's bound misses its mean: probability <= alpha, as before; alpha bounds
# the probability that a run whose quality never falls by more than the margin (rho x the reference's gain so far,
# plus m) is ever stopped. For the reference s = 0, c = y_k - y_0: the plain paired difference. With rho = 0 every
# contrast is the plain paired difference and the rule is the one above.


def look_weight(j: np.ndarray | int, horizon: int = 0) -> np.ndarray | float:
    """The share of alpha the j-th judged look spends (j >= 1; the shares sum to 1 over j = 1, 2, ...).
    horizon 0 (no planned number of looks): 1 / (j (j + 1)). horizon K (the looks the run is planned to have,
    fixed before any score, e.g. steps / eval_every): 1 / (K + 1) for each of the first K looks, and
    1 / (j (j + 1)) after them (a run longer than planned still has sum_{j > K} 1 / (j (j + 1)) = 1 / (K + 1))."""
    j = np.asarray(j, dtype=float)
    tail = 1.0 / (j * (j + 1.0))
    return tail if horizon <= 0 else np.where(j <= horizon, 1.0 / (horizon + 1.0), tail)


def pair_alpha(alpha: float, k: np.ndarray | int, j: np.ndarray | int | None = None,
               horizon: int = 0) -> np.ndarray | float:
    """The level of each reference's sequence at the j-th judged look, which has k earlier checkpoints:
    alpha * look_weight(j, horizon) / k; j = k without a warm-up, i.e. alpha / (k^2 (k + 1)) with no horizon."""
    k = np.asarray(k, dtype=float)
    j = k if j is None else np.asarray(j, dtype=float)
    return alpha * look_weight(j, horizon) / k


# --------------------------------------------------------------------------- 4. the detector


class Verdict(enum.StrEnum):
    """What the rule says at a checkpoint: stop the run; continue; or continue, but the point estimate shows a
    decline beyond the margin that the sequence cannot yet tell from noise (the gate may score more prompts for
    the two checkpoints in question, `monitor.pair`, and ask again with `recheck`)."""

    STOP = "stop"
    CONTINUE = "continue"
    EXTEND = "extend"


@dataclass(frozen=True)
class Comparison:
    """The current checkpoint against one earlier one: d = current - reference on their common prompts (with a
    relative margin: the prompts the first checkpoint shares too)."""

    reference_step: float
    step: float
    n: int
    mean: float
    sd: float
    lower: float
    upper: float
    alpha: float
    #: the contrast the pair is judged on (it fires when c_upper < -margin): with a relative margin rho,
    #: current - (1 - rho) reference - rho first checkpoint, its mean and upper bound; without one, mean and upper
    c_mean: float = math.nan
    c_upper: float = math.nan


def _mean_sd(d: np.ndarray, seen: np.ndarray, n: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row of `d` (NaN where not scored): the mean and SD (ddof 1) over the `seen` entries, `n` of them."""
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.where(seen, d, 0.0).sum(axis=1) / n
        sd = np.sqrt(np.where(seen, (d - mean[:, None]) ** 2, 0.0).sum(axis=1) / (n - 1))
    return mean, sd


class PairedMonitor(Monitor):
    """One run's state: every checkpoint's per-prompt scores so far (NaN where a prompt was not scored)."""

    __slots__ = ("det", "steps", "prompts", "rows", "n_opt", "verdict", "comparisons", "kept_step", "pair",
                 "prompt_counts")

    def __init__(self, det: PairedStop):
        self.det = det
        self.steps: list[float] = []
        self.prompts: dict[str, int] = {}  # prompt id -> column
        self.rows: list[dict[int, float]] = []  # per checkpoint: column -> score
        self.n_opt = float(det.prompts_opt) if det.prompts_opt else math.nan
        self.verdict = Verdict.CONTINUE
        self.comparisons: list[Comparison] = []
        self.kept_step = math.nan  # the checkpoint to keep once stopped
        # when EXTEND: the steps that need more prompts: (reference, current), with a relative margin
        # (first checkpoint, reference, current)
        self.pair: tuple[float, ...] | None = None
        self.prompt_counts: dict[tuple[int, int], set[int]] = {}  # (reference, current) -> prompt counts judged at

    # ---- feeding scores
    def observe(self, cp: Checkpoint, scores: Mapping[str, float] | np.ndarray | None = None) -> bool:
        """Record checkpoint `cp` with its per-prompt scores (prompt id -> score, higher is better; or a vector
        whose position j is prompt id "j", the same prompt at every checkpoint; NaN: not scored) and decide.
        A checkpoint without per-prompt scores is no evidence: the rule never stops on means alone."""
        if scores is None:
            self.verdict, self.comparisons, self.pair = Verdict.CONTINUE, [], None
            return False
        return self.observe_scores(cp.step, scores)

    def observe_scores(self, step: float, scores: Mapping[str, float] | np.ndarray) -> bool:
        """`observe` without a Checkpoint: a new checkpoint at `step` (after every earlier one)."""
        if self.steps and not step > self.steps[-1]:
            raise ValueError(f"paired rule: step {step:g} is not after the last checkpoint ({self.steps[-1]:g})")
        self.steps.append(float(step))
        self.rows.append({})
        self._add(len(self.steps) - 1, scores)
        if self.n_opt != self.n_opt:  # the gate's prompt count, fixed by design before any score: where to be tight
            self.n_opt = float(max(len(self.rows[0]), self.det.min_prompts))
        return self.decide()

    def add_scores(self, step: float, scores: Mapping[str, float] | np.ndarray) -> None:
        """More prompts for an already observed checkpoint (the gate scored the next prompts of its pool for the
        two checkpoints in question); call `recheck` after adding them to both."""
        try:
            i = self.steps.index(float(step))
        except ValueError:
            raise ValueError(f"paired rule: step {step:g} was never observed") from None
        self._add(i, scores)

    def recheck(self) -> bool:
        """Decide again at the current checkpoint with every score added since (same levels: the sequence holds
        at every number of prompts)."""
        return self.decide()

    def _add(self, i: int, scores: Mapping[str, float] | np.ndarray) -> None:
        row = self.rows[i]
        items = scores.items() if hasattr(scores, "items") else ((str(j), v) for j, v in enumerate(scores))
        for pid, value in items:
            v = float(value)
            if v != v:
                continue  # not scored
            if not math.isfinite(v):
                raise ValueError(f"paired rule: step {self.steps[i]:g} prompt '{pid}': score {v} is not finite")
            col = self.prompts.setdefault(str(pid), len(self.prompts))
            if col in row and row[col] != v:
                raise ValueError(f"paired rule: step {self.steps[i]:g} prompt '{pid}' was already scored "
                                 f"({row[col]:g}, now {v:g})")
            row[col] = v

    # ---- the decision
    def decide(self) -> bool:
        """Compare the current checkpoint with every earlier one; True (and verdict STOP) when some comparison's
        sequence lies wholly below -margin."""
        k = len(self.steps) - 1
        self.comparisons, self.pair = [], None
        first = max(1, self.det.warmup)  # the first judged checkpoint's number of earlier ones
        if k < first:
            self.verdict = Verdict.CONTINUE
            return False
        det = self.det
        width = len(self.prompts)
        y = np.full((k + 1, width), np.nan)
        for i, row in enumerate(self.rows):
            if row:
                y[i, list(row)] = list(row.values())
        d = y[k] - y[:k]  # current - reference, per prompt; NaN where either was not scored
        rho = det.relative_margin
        # the contrast the pair is judged on: with a relative margin, current - (1 - rho) reference - rho first
        # (NaN where any of the three was not scored); else the paired difference itself
        c = d + rho * (y[:k] - y[0]) if rho else d
        seen = ~np.isnan(c)
        n = seen.sum(axis=1)
        a = pair_alpha(det.alpha, k, k - first + 1, det.horizon)
        mean, sd = _mean_sd(np.where(seen, d, np.nan), seen, n)
        c_mean, c_sd = _mean_sd(c, seen, n) if rho else (mean, sd)
        c_upper = c_mean + det.radius(np.maximum(n, 1), c_sd, a, self.n_opt)
        radius = det.radius(np.maximum(n, 1), sd, a, self.n_opt)
        judged = n >= det.min_prompts
        if det.prompt_looks:  # each pair is judged at no more than prompt_looks prompt counts
            for j in np.flatnonzero(judged):
                counts = self.prompt_counts.setdefault((int(j), k), set())
                if int(n[j]) not in counts and len(counts) >= det.prompt_looks:
                    judged[j] = False
                else:
                    counts.add(int(n[j]))
        upper, lower = mean + radius, mean - radius
        self.comparisons = [Comparison(self.steps[j], self.steps[k], int(n[j]), float(mean[j]), float(sd[j]),
                                       float(lower[j]), float(upper[j]), float(a), float(c_mean[j]),
                                       float(c_upper[j])) for j in np.flatnonzero(judged)]
        if not judged.any():
            self.verdict = Verdict.CONTINUE
            return False
        up = np.where(judged, c_upper, np.inf)
        if (up < -det.margin).any():
            # keep the checkpoint the evidence favours: the one the current checkpoint is furthest below on their
            # common prompts (the best so far on these prompts)
            self.kept_step = self.steps[int(np.argmin(np.where(judged, mean, np.inf)))]
            self.verdict = Verdict.STOP
            return True
        closest = int(np.argmin(up))
        promising = c_mean[closest] < -det.margin
        if promising and det.extend_factor:  # would the same mean and SD on extend_factor x the prompts settle it?
            n_more = det.extend_factor * n[closest]
            promising = bool(c_mean[closest] + det.radius(n_more, c_sd[closest], a, self.n_opt) < -det.margin)
        if promising:
            self.verdict = Verdict.EXTEND
            # the checkpoints the pair's contrast reads: with a relative margin, the first checkpoint too
            first_step = (self.steps[0],) if rho and closest else ()
            self.pair = first_step + (self.steps[closest], self.steps[k])
        else:
            self.verdict = Verdict.CONTINUE
        return False

    def wants_more_evidence(self) -> bool:
        """Undecided, and the point estimate says decline beyond the margin (verdict EXTEND): more prompts for
        `pair` could settle it."""
        return self.verdict is Verdict.EXTEND


class PairedStop(Detector):
    """Stop a run when a confidence sequence on the paired per-prompt difference between its current checkpoint
    and an earlier one shows a decline beyond `margin`; keep the earlier checkpoint the current one is furthest
    below. `alpha` bounds the probability that a healthy run (no checkpoint worse than an earlier one by more than
    `margin`) is ever stopped, over all its checkpoints, every candidate reference (the best so far is chosen by
    peeking at the same scores: every earlier checkpoint is a candidate and is paid for by a union bound, spending
    alpha / (k (k + 1)) at the k-th look, split over its k references) and any number of extra prompts. `margin` is
    in the score's units. A pair is judged once it shares `min_prompts` prompts (the sequence plugs in the sample
    SD, valid as the prompt count grows); `prompts_opt` is where the sequence is tightest (default: the first
    checkpoint's prompt count, the gate's design). The first `warmup` checkpoints are references only, never
    judged (early training dips and recovers; the spending then starts at the first judged look). `horizon`: the
    judged looks the run plans (0: unknown; alpha / (j (j + 1)) at the j-th). `prompt_looks`: the most prompt counts
    a pair is judged at (the gate's, then each extension batch; 0: any, with the confidence sequence).
    `extend_factor`: EXTEND only when the same mean and SD on extend_factor x the prompts would settle the pair
    (0: on any decline beyond the margin), so the gate's extra eval goes where it can decide.
    `relative_margin` rho (0 <= rho < 1): a decline must also exceed rho x the reference's gain over the run's first
    checkpoint (healthy: no mu_s - mu_k > rho max(0, mu_s - mu_0) + margin); the bound covers it with the same alpha
    (the comment above `look_weight`), and EXTEND then names the first checkpoint too (`monitor.pair`: three steps).
    Default 0.125, chosen on the per-prompt corpus's tune and report parts together, both already read (in-sample:
    docs/detectors.md, "A margin relative to the gain"); 0 is the rule before it.

    Needs per-prompt scores (`monitor.observe(cp, scores)`, or `rlhfops detect --prompts`): on means alone it
    never stops. The math is in this module's comments, top to bottom."""

    name = "paired"
    title = "Paired"
    needs = ("prompt_scores",)

    def __init__(self, alpha: float = 0.02, margin: float = 0.0, min_prompts: int = 10, prompts_opt: int = 0,
                 warmup: int = 0, horizon: int = 0, prompt_looks: int = 3, extend_factor: float = 4.0,
                 relative_margin: float = 0.125):
        if not 0.0 < alpha < 1.0:
            raise ValueError("paired: alpha must be in (0, 1)")
        if not (math.isfinite(margin) and margin >= 0.0):
            raise ValueError("paired: margin must be a finite number >= 0 (in the score's units)")
        if not (math.isfinite(relative_margin) and 0.0 <= relative_margin < 1.0):
            raise ValueError("paired: relative_margin must be in [0, 1) (a share of the reference's gain over the "
                             "first checkpoint)")
        self.relative_margin = float(relative_margin)
        if min_prompts < 2 or prompts_opt < 0:
            raise ValueError("paired: need min_prompts >= 2 and prompts_opt >= 0 (0: the first checkpoint's count)")
        self.alpha, self.margin = float(alpha), float(margin)
        self.min_prompts, self.prompts_opt = int(min_prompts), int(prompts_opt)
        if warmup < 0:
            raise ValueError("paired: warmup must be >= 0 (checkpoints that are references only)")
        self.warmup = int(warmup)
        if horizon < 0 or prompt_looks < 0:
            raise ValueError("paired: horizon and prompt_looks must be >= 0 (0: no planned count)")
        self.horizon, self.prompt_looks = int(horizon), int(prompt_looks)
        if not (math.isfinite(extend_factor) and (extend_factor == 0.0 or extend_factor > 1.0)):
            raise ValueError("paired: extend_factor must be 0 (extend on any decline beyond the margin) or > 1")
        self.extend_factor = float(extend_factor)

    def radius(self, n: np.ndarray | float, sd: np.ndarray | float, a: float, n_opt: float) -> np.ndarray:
        """The bound's half-width for a pair at level a: the confidence sequence over any number of prompt counts
        (prompt_looks 0), else the one-sided t bound over at most prompt_looks counts."""
        if self.prompt_looks:
            return fixed_radius(n, sd, a, self.prompt_looks)
        return cs_radius(n, sd, a, mixture_r(n_opt, a))

    def start(self) -> PairedMonitor:
        return PairedMonitor(self)

    def params(self) -> dict[str, Any]:
        return {"alpha": self.alpha, "margin": self.margin, "min_prompts": self.min_prompts,
                "prompts_opt": self.prompts_opt, "warmup": self.warmup, "horizon": self.horizon,
                "prompt_looks": self.prompt_looks, "extend_factor": self.extend_factor,
                "relative_margin": self.relative_margin}

    # ------------------------------------------------------------------- 5. many runs at once
    def scan_scores(self, scores: np.ndarray, counts: tuple[int, ...] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The monitor's decisions over many runs with complete records, vectorised over runs:
        `scores[runs, checkpoints, prompts]` (higher is better, no NaN). Returns per run the index of the checkpoint
        where the rule stops (-1: never) and the index of the checkpoint it keeps (-1 when not stopped).

        `counts` (increasing prompt counts, the last at most `prompts`; default: all of them): every pair is judged
        on its first n prompts for each n in `counts`, the worst case of the gate's extension (every pair extended
        through the whole pool at every look); the sequence is tightest at the first count, the gate's own.

        Per look k it needs, for every earlier checkpoint s, the mean and SD of y_k - y_s over prompts: the mean is
        m_k - m_s (checkpoint means) and the sum of squared deviations is C_kk + C_ss - 2 C_ks, C the prompts'
        centred cross-product matrix of the run's checkpoints (one batched matrix product for every look). With a
        relative margin the contrast y_k - (1 - rho) y_s - rho y_0 has weights w and sum of squares w' C w."""
        y = np.asarray(scores, dtype=float)
        if y.ndim != 3 or not np.isfinite(y).all():
            raise ValueError("scan_scores: need a finite array [runs, checkpoints, prompts]")
        runs, steps, p = y.shape
        counts = (p,) if counts is None else tuple(int(n) for n in counts)
        if any(b <= a for a, b in zip(counts, counts[1:], strict=False)) or counts[-1] > p:
            raise ValueError(f"scan_scores: counts {counts} must increase and be at most the {p} prompts")
        if self.prompt_looks and len(counts) > self.prompt_looks:
            raise ValueError(f"scan_scores: {len(counts)} prompt counts, but prompt_looks is {self.prompt_looks}")
        stop = np.full(runs, -1, dtype=np.int64)
        kept = np.full(runs, -1, dtype=np.int64)
        counts = tuple(n for n in counts if n >= self.min_prompts)
        if not counts or steps < 2:
            return stop, kept
        n_opt = float(self.prompts_opt or max(counts[0], self.min_prompts))
        moments = []
        for n in counts:
            m = y[:, :, :n].mean(axis=2)
            yc = y[:, :, :n] - m[:, :, None]
            c = np.einsum("rsp,rtp->rst", yc, yc)
            moments.append((n, m, c, np.einsum("rss->rs", c)))
        first = max(1, self.warmup)
        rho = self.relative_margin
        for k in range(first, steps):
            a = float(pair_alpha(self.alpha, k, k - first + 1, self.horizon))
            for n, m, c, diag in moments:
                live = stop < 0
                if not live.any():
                    return stop, kept
                mean = m[live, k, None] - m[live, :k]
                ss = np.maximum(diag[live, k, None] + diag[live, :k] - 2.0 * c[live, k, :k], 0.0)
                sd = np.sqrt(ss / (n - 1))
                if rho:  # the contrast y_k - (1 - rho) y_s - rho y_0 instead: weights w, sum of squares w' C w
                    c_mean = mean + rho * (m[live, :k] - m[live, 0, None])
                    ss = (diag[live, k, None] + (1 - rho) ** 2 * diag[live, :k] + rho**2 * diag[live, 0, None]
                          - 2 * (1 - rho) * c[live, k, :k] - 2 * rho * c[live, k, 0, None]
                          + 2 * rho * (1 - rho) * c[live, :k, 0])
                    sd = np.sqrt(np.maximum(ss, 0.0) / (n - 1))
                else:
                    c_mean = mean
                upper = c_mean + self.radius(n, sd, a, n_opt)
                fired = (upper < -self.margin).any(axis=1)
                idx = np.flatnonzero(live)[fired]
                stop[idx] = k
                kept[idx] = np.argmin(mean[fired], axis=1)
        return stop, kept


# --------------------------------------------------------------------------- 6. verdicts for `detect --prompts`


def paired_verdicts(det: PairedStop, runs: list, records: Mapping[str, tuple[np.ndarray, list[str], np.ndarray]]):
    """Replay each run (`eval.traces.Run`) through a fresh monitor fed its per-prompt scores (`records`: run id ->
    `eval.prompt_records.paired_matrix`, in the run's higher-is-better units): the verdicts CSV of `rlhfops detect`,
    the kept checkpoint being the monitor's (the best checkpoint by eval when not stopped), and the usefulness
    columns of `eval.traces.usefulness`."""
    import pandas as pd

    from eval.traces import verdict_row

    rows = []
    for run in runs:
        steps, prompts, scores = records[run.run_id]
        by_step = {float(s): i for i, s in enumerate(steps)}
        monitor = det.start()
        best_i, best, stop_i, kept_i = -1, -math.inf, None, -1
        for i, cp in enumerate(run.checkpoints):
            if cp.eval_score == cp.eval_score and cp.eval_score > best:
                best_i, best = i, cp.eval_score
            j = by_step.get(float(cp.step))
            if j is None:
                continue
            if monitor.observe(cp, dict(zip(prompts, scores[j], strict=True))):
                stop_i = i
                kept_i = int(np.searchsorted(run.steps, monitor.kept_step))
                break
        if stop_i is None:
            kept_i = best_i
        rows.append(verdict_row(run, stop_i, kept_i))
    return pd.DataFrame(rows)
