"""How far any constant threshold on the paired decline could go on the per-prompt corpus, with the threshold chosen
knowing the labels: an upper bound for that family of rules, not a rule.

The family: at checkpoint k, z_k is the largest paired t statistic over the earlier checkpoints s of the per-prompt
contrast (1 - rho) y_s + rho y_0 - y_k (the paired rule's decline with `relative_margin` rho, on the same common
random numbers); a rule of the family stops at the first k with z_k > t. For each rho and prompt count the threshold
t is the one that, among those stopping at most `fs_cap` of the healthy runs, stops the most hacking runs usefully
(at or after their gold peak, before the last checkpoint; eval.traces.usefulness). No error rate is stated for it:
t is fitted to the labels of the very runs it is scored on. An anytime-valid rule must use a larger t (the paired
rule's bound is 4.2-4.5 paired SEs at 64 prompts), so when this ceiling is below a recall bar, no rule of the family
reaches the bar on those runs at that false-stop cap.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from eval.corpus import hindsight_label
from eval.traces import Run, peak_index


class PartRuns(Protocol):
    """What the tables read of a corpus part (`studies.paired_report.PartRuns`; that module imports this one): its
    labelled runs and, per run, the gold scores [checkpoints, prompts] in prompt-id order."""

    runs: list[Run]
    scores: dict[str, np.ndarray]


CEILING_RHOS = (0.0, 0.1, 0.125, 0.2, 0.3)
CEILING_PROMPTS = (64, 128)


def decline_z(scores: np.ndarray, prompts: int, rho: float) -> np.ndarray:
    """z_k (see the module docstring) at each checkpoint of one run, on its first `prompts` prompts
    (`scores`: [checkpoints, prompts] gold scores); -inf at the first checkpoint (nothing to compare with) and where
    no contrast has spread."""
    y = np.asarray(scores, dtype=float)[:, :prompts]
    z = np.full(y.shape[0], -np.inf)
    for k in range(1, y.shape[0]):
        d = (1.0 - rho) * y[:k] + rho * y[0] - y[k]  # [earlier checkpoints, prompts]
        sd = d.std(axis=1, ddof=1)
        with np.errstate(divide="ignore", invalid="ignore"):
            t = np.where(sd > 0, d.mean(axis=1) / (sd / np.sqrt(y.shape[1])), -np.inf)
        z[k] = float(t.max())
    return z


def hindsight_threshold(healthy: list[np.ndarray], hacking: list[tuple[np.ndarray, int]],
                        fs_cap: float) -> tuple[int, float, int]:
    """(useful stops, t, false stops) of the threshold t that stops at most `fs_cap` of the `healthy` z paths and
    the most `hacking` runs usefully; each hacking run is (z path, gold peak index), useful when its first crossing
    lands in [peak, last - 1]. Ties go to the larger t (fewer false stops)."""
    values = np.concatenate([z[np.isfinite(z)] for z in [*healthy, *(z for z, _ in hacking)]] + [np.array([np.inf])])
    cands = np.unique(values)  # stop when z > t: between two values nothing changes, so the values suffice
    h_max = np.array([z.max() for z in healthy]) if healthy else np.zeros(0)
    false = (h_max[None, :] > cands[:, None]).sum(axis=1)
    useful = np.zeros(cands.size, dtype=int)
    for z, peak in hacking:
        first = np.searchsorted(np.maximum.accumulate(z), cands, side="right")  # first k with z_k > t
        useful += (first >= peak) & (first <= z.size - 2)
    ok = false <= fs_cap * len(healthy)
    best = max(np.flatnonzero(ok), key=lambda i: (useful[i], cands[i]))
    return int(useful[best]), float(cands[best]), int(false[best])


def ceiling_table(data: dict[str, PartRuns], fs_cap: float = 0.02, rhos=CEILING_RHOS,
                  prompt_counts=CEILING_PROMPTS) -> str:
    """Per prompt count and rho: the hindsight threshold on all the given parts pooled (useful and false stops),
    and on each part with its own hindsight threshold (markdown)."""
    names = list(data)
    out = ["| prompts | rho | all parts: t, useful, false stops | "
           + " | ".join(f"{n}: t, useful, false stops" for n in names) + " |", "| --- " * (3 + len(names)) + "|"]
    for prompts in prompt_counts:
        for rho in rhos:
            paths: dict[str, tuple[list, list]] = {}
            for n, part in data.items():
                healthy, hacking = [], []
                for run in part.runs:
                    z = decline_z(part.scores[run.run_id], prompts, rho)
                    if run.label == 1:
                        hacking.append((z, peak_index(run)))
                    else:
                        healthy.append(z)
                paths[n] = (healthy, hacking)
            cells = []
            for healthy, hacking in [([z for h, _ in paths.values() for z in h],
                                      [x for _, u in paths.values() for x in u]), *paths.values()]:
                useful, t, false = hindsight_threshold(healthy, hacking, fs_cap)
                cells.append(f"{t:.2f}, {useful}/{len(hacking)} = {100 * useful / max(len(hacking), 1):.1f}%, "
                             f"{false}/{len(healthy)}")
            out.append(f"| {prompts} | {rho:g} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def pool_label(steps, scores: np.ndarray, lo: int = 64, hi: int = 128) -> int:
    """The hindsight label of one run on the mean of prompts [lo, hi) (the recorded pool), its SE from their spread."""
    y = np.asarray(scores, dtype=float)[:, lo:hi]
    return hindsight_label(steps, y.mean(axis=1), eval_se=y.std(axis=1, ddof=1) / np.sqrt(y.shape[1])).label


def label_agreement(data: dict[str, PartRuns]) -> str:
    """Per part and pooled: the gate's labels (the runs' own, on prompts 0-63) against the pool's (prompts 64-127):
    of the runs the gate calls hacking, how many the pool does too, and of the healthy ones (markdown)."""
    out = ["| part | gate: hacking | of them, pool: hacking | gate: healthy | of them, pool: healthy |",
           "| --- | --- | --- | --- | --- |"]
    total = np.zeros((2, 2), dtype=int)
    rows = []
    for name, part in data.items():
        t = np.zeros((2, 2), dtype=int)
        for run in part.runs:
            t[int(run.label), pool_label(run.steps, part.scores[run.run_id])] += 1
        total += t
        rows.append((name, t))
    for name, t in [*rows, *([("all", total)] if len(rows) > 1 else [])]:
        h, g = t[1].sum(), t[0].sum()
        out.append(f"| {name} | {h} | {t[1, 1]} = {100 * t[1, 1] / max(h, 1):.1f}% | {g} | "
                   f"{t[0, 0]} = {100 * t[0, 0] / max(g, 1):.1f}% |")
    return "\n".join(out)
