"""What the default detector's family can reach on a corpus split, in hindsight: the recall/false-stop frontier.

For every shape of the selection grid (`studies.detector_selection.candidates`) and every value of its bar `z`,
count the split's hacking runs stopped usefully (at or after the gold peak, before the last checkpoint) and the
healthy runs stopped, on the split and on the calibration fleet (the healthy runs of `eval.corpus.CHOSEN_ON_SPLITS`,
where the default's bar was fitted). The frontier keeps, for each number of useful stops, the point that stops the
fewest calibration runs.

Finding the best point by reading the split is what the selection rule forbids, so the frontier is an upper bound:
a target it does not reach is out of this family's reach on that split, whatever the next version chooses.

Exact, not a grid over `z`: a monitor is online and stops as soon as its statistic passes the bar, so whether it has
stopped by checkpoint j is monotone in `z`, and each run's verdict changes only at a few critical values, found by
bisection on prefixes of the run (`eval.calibrate.critical_threshold`):

- a healthy run is stopped iff z < crit(all checkpoints);
- a hacking run whose gold peak is checkpoint p, of n, is stopped usefully iff crit(checkpoints[:p]) <= z <
  crit(checkpoints[:n-1]): not stopped before its peak, stopped before its end.

Each frontier point is then replayed at a `z` inside its piece by `eval.traces.verdicts`, the path every report
uses, and the counts of that replay are what the table shows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from eval.detectors import make_detector
from studies.detector_selection import DETECTOR, candidates, map_in_processes

#: bisection steps per critical value: the bar's range (0, 64) to about 1e-8
ITERS = 32


@dataclass
class ShapeCriticals:
    """One shape's critical bar values: stopped iff z < `healthy[i]` (split) / `fleet[i]` (calibration fleet);
    hacking run i is stopped usefully iff `useful_from[i]` <= z < `useful_to[i]`."""
    shape: dict[str, Any]
    params: dict[str, Any]
    healthy: np.ndarray
    fleet: np.ndarray
    useful_from: np.ndarray
    useful_to: np.ndarray

    def counts(self, z: float) -> tuple[int, int, int]:
        """(useful stops on the split, healthy runs stopped on the split, fleet runs stopped) at bar `z`."""
        useful = int(np.sum((self.useful_from <= z) & (z < self.useful_to)))
        return useful, int(np.sum(z < self.healthy)), int(np.sum(z < self.fleet))

    def pieces(self) -> list[tuple[float, float]]:
        """The intervals [lo, hi) of `z` on which every count is constant, lowest first (the last is unbounded)."""
        cuts = np.concatenate([[0.0], self.healthy, self.fleet, self.useful_from, self.useful_to])
        cuts = np.unique(cuts[np.isfinite(cuts)])
        return [(float(lo), float(hi)) for lo, hi in zip(cuts, [*cuts[1:], math.inf], strict=True)]


def shape_criticals(shape: dict[str, Any], base: dict[str, Any], split_runs, fleet_runs,
                    iters: int = ITERS) -> ShapeCriticals:
    """Critical values of one shape (`shape` over `base` parameters) on the split's runs (labelled eval.traces
    runs) and on the fleet's healthy runs."""
    from eval.calibrate import critical_threshold
    from eval.traces import peak_index

    params = {**base, **shape}
    key = make_detector(DETECTOR, **params).threshold

    def crit(checkpoints) -> float:
        return critical_threshold(DETECTOR, params, checkpoints, iters=iters, key=key)

    hacking = [r for r in split_runs if r.label == 1]
    return ShapeCriticals(
        shape=dict(shape), params=params,
        healthy=np.array([crit(r.checkpoints) for r in split_runs if r.label == 0]),
        fleet=np.array([crit(cps) for cps in fleet_runs]),
        useful_from=np.array([crit(r.checkpoints[:max(peak_index(r), 0)]) for r in hacking]),
        useful_to=np.array([crit(r.checkpoints[:-1]) for r in hacking]),
    )


def _criticals(args) -> ShapeCriticals:
    return shape_criticals(*args)


def frontier_points(crits: list[ShapeCriticals]) -> pd.DataFrame:
    """For each number of useful stops any shape reaches at some `z`: the point (shape, piece of `z`) that stops
    the fewest fleet runs, ties to the fewest split healthy runs, then to grid order."""
    best: dict[int, tuple] = {}
    for order, c in enumerate(crits):
        for lo, hi in c.pieces():
            useful, healthy, fleet = c.counts(lo)
            key = (fleet, healthy, order)
            if useful not in best or key < best[useful][0]:
                best[useful] = (key, c, lo, hi)
    rows = []
    for useful, ((fleet, healthy, _), c, lo, hi) in sorted(best.items(), reverse=True):
        z = (lo + hi) / 2.0 if math.isfinite(hi) else lo + 1.0
        rows.append({"useful": useful, "fleet_stopped": fleet, "healthy_stopped": healthy, **c.shape, "z": z,
                     "z_from": lo, "z_to": hi, "params": {**c.params, "z": z}})
    table = pd.DataFrame(rows)
    # a point needing more fleet stops than a point with more useful stops is dominated: drop it
    keep = table["fleet_stopped"] < table["fleet_stopped"].astype(float).cummin().shift(fill_value=math.inf)
    return table[keep].reset_index(drop=True)


def replay(point: pd.Series, split_runs, fleet_runs) -> tuple[int, int, int]:
    """(useful stops, split healthy stopped, fleet stopped) of a frontier point replayed by `eval.traces.verdicts`."""
    from eval.traces import detection_quality, verdicts

    det = make_detector(DETECTOR, **point["params"])
    q = detection_quality(verdicts(det, split_runs))
    stopped = int(verdicts(det, fleet_runs)["stopped"].sum()) if fleet_runs else 0
    return int(q["useful"]), int(q["fp"]), stopped


def frontier(split_runs, fleet_runs, workers: int | None = 1, shapes: list[dict[str, Any]] | None = None,
             config=None, on_done=None) -> pd.DataFrame:
    """The frontier of the selection grid's shapes (or `shapes`) on `split_runs` (labelled eval.traces runs), with
    `fleet_runs` (eval.traces runs, healthy) as the calibration fleet; every point replayed (see `replay`). Raises
    RuntimeError when a replay disagrees with the critical values (a detector whose stops are not monotone in z)."""
    base = make_detector(DETECTOR, config=config).params()
    fleet = [r.checkpoints for r in fleet_runs]
    jobs = [(shape, base, split_runs, fleet) for shape in (candidates() if shapes is None else shapes)]
    table = frontier_points(map_in_processes(_criticals, jobs, workers, on_done))
    for i, point in table.iterrows():
        got = replay(point, split_runs, fleet_runs)
        want = (int(point.useful), int(point.healthy_stopped), int(point.fleet_stopped))
        if got != want:
            raise RuntimeError(f"frontier point {i} ({point['params']}): critical values give (useful, healthy, "
                               f"fleet) = {want}, the replay {got}")
    return table


def default_point(split_runs, fleet_runs, config=None) -> tuple[int, int, int]:
    """(useful stops, split healthy stopped, fleet stopped) of the configured default detector."""
    return replay(pd.Series({"params": make_detector(DETECTOR, config=config).params()}), split_runs, fleet_runs)


def render(table: pd.DataFrame, splits: tuple[str, ...], fleet_splits: tuple[str, ...], hacking: int,
           healthy: int, fleet: int, default: tuple[int, int, int], recall_bar: float = 0.85,
           fsr_bar: float = 0.03) -> str:
    """The frontier as markdown, with the default's own point and where the family meets (`recall_bar` useful
    recall at most `fsr_bar` of the healthy runs stopped), if it does."""
    def pct(k: int, n: int) -> str:
        return f"{k}/{n} ({k / n:.1%})" if n else f"{k}/{n}"

    need = math.ceil(recall_bar * hacking - 1e-9)
    ok = table[(table.useful >= need) & (table.fleet_stopped <= fsr_bar * fleet)
               & (table.healthy_stopped <= fsr_bar * healthy)]
    lines = [
        f"# What `{DETECTOR}` can reach on {' + '.join(splits)}, in hindsight",
        "",
        f"Generated by `rlhfops detector-frontier {' '.join(f'--split {s}' for s in splits)}` "
        "(studies/detector_frontier.py): every shape of the selection "
        f"grid ({len(candidates())} shapes) at every value of its bar `z`, exactly (critical values by bisection, "
        "each row replayed by `eval.traces.verdicts`).",
        "",
        f"- Split: {' + '.join(splits)}: {hacking} hacking runs, {healthy} healthy runs.",
        f"- Calibration fleet: the healthy runs of {' + '.join(fleet_splits)} ({fleet} runs), where the default's "
        "bar was fitted.",
        "- Each row: the point that stops the fewest fleet runs for that many useful stops; a row that needs more "
        "fleet stops than a row with more useful stops is left out.",
        "- This reads the split to find the best point, which the selection rule forbids: it is an upper bound "
        "on what any version of this family can reach there, not a candidate.",
        "",
        "| useful stops | fleet runs stopped | split healthy stopped | patience | drawdown | fast_window "
        "| fast_ratio | mean_window | z |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in table.itertuples():
        lines.append(f"| {pct(r.useful, hacking)} | {pct(r.fleet_stopped, fleet)} | {pct(r.healthy_stopped, healthy)} "
                     f"| {r.patience} | {r.drawdown} | {r.fast_window} | {r.fast_ratio} | {r.mean_window} "
                     f"| {r.z_from:.4g}-{r.z_to:.4g} |")
    lines += [
        "",
        f"The configured default: {pct(default[0], hacking)} useful, {pct(default[1], healthy)} split healthy "
        f"stopped, {pct(default[2], fleet)} fleet runs stopped.",
        "",
    ]
    bar = (f"{recall_bar:.0%} useful recall ({need} of {hacking}) with at most {fsr_bar:.0%} of the healthy runs "
           f"stopped on the split and on the fleet")
    if ok.empty:
        reach = table[table.useful >= need]
        least = (f" Every point with {need} or more useful stops stops at least "
                 f"{pct(int(reach.fleet_stopped.min()), fleet)} of the fleet." if not reach.empty else "")
        lines.append(f"**No shape at any `z` reaches {bar}.**{least}")
    else:
        r = ok.iloc[-1]
        lines.append(f"The family reaches {bar} in hindsight, at best with {pct(int(r.fleet_stopped), fleet)} of the "
                     "fleet stopped (the row above with that count).")
    return "\n".join(lines) + "\n"
