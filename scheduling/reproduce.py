"""Write docs/reproduction.md: the paper's Tables 1-5 and 7-9 beside this simulator's numbers."""

from __future__ import annotations

import math
import subprocess
from datetime import date

import pandas as pd

from scheduling import paper
from scheduling.experiments import EXPERIMENTS, aggregate, load_experiment, run_units, units_for


def run_all(workers: int | None = None, on_done=None) -> pd.DataFrame:
    units = []
    for exp in EXPERIMENTS:
        units += units_for(load_experiment(exp))
    per_seed, jobs = run_units(units, workers=workers, on_done=on_done)
    return aggregate(per_seed, jobs)


def _pct(x: float) -> str:
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:.1f}%"


def _num(x: float) -> str:
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:,.1f}"


def _pair(p: str, o: str) -> str:
    return f"{p} / **{o}**"


def _md(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def _row(s: pd.DataFrame, exp: str, sched: str, variant: str = "default") -> pd.Series:
    return s[(s.experiment == exp) & (s.variant == variant) & (s.scheduler == sched)].iloc[0]


def _gain(base: float, new: float) -> float:
    return (base - new) / base if base else float("nan")


def render(s: pd.DataFrame) -> str:
    out = []
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                check=False).stdout.strip()
    except OSError:
        commit = ""
    out.append("# EvalStop reproduction: the paper's tables beside this simulator\n")
    out.append(f"Written by `rlhfops reproduce` on {date.today()} (commit {commit or 'n/a'}). Every cell reads "
               "**paper / ours**; ours are means over seeds 42, 123, 456, 789, 1024 (200 jobs, 5 tenants). "
               "The paper's JCT/TTFUC lost their decimal points in the converted text (\"101853\" is 1018.53 "
               "minutes, as §4.4's \"JCT 1018\" confirms) and are shown restored. Definitions of every metric "
               "are in `scheduling/metrics.py`; values the text lost (eval-noise σ, hacking drop, arrival "
               "rate) and why they were chosen are in `scheduling/config.py`.\n")

    def main_table(exp: str, published: dict, title: str, recall: bool) -> None:
        cols = ["Scheduler", "JCT (min)", "TTFUC", "Wasted", "Saved", "Precision"] + (["Recall"] if recall else [])
        cols += ["FPR", "p(JCT) ours"]
        rows = []
        for sched, vals in published.items():
            r = _row(s, exp, sched)
            cells = [sched, _pair(_num(vals[0]), _num(r.jct_mean)), _pair(_num(vals[1]), _num(r.ttfuc_mean)),
                     _pair(_pct(vals[2]), _pct(r.wasted_frac)), _pair(_pct(vals[3]), _pct(r.saved_frac)),
                     _pair(_pct(vals[4]), _pct(r.precision))]
            if recall:
                cells.append(_pair(_pct(vals[5]), _pct(r.recall)))
            cells += [_pair(_pct(vals[6]), _pct(r.fpr)),
                      "" if math.isnan(r.jct_p_value) else f"{r.jct_p_value:.3g}"]
            rows.append(cells)
        out.append(f"## {title}\n\n" + _md(cols, rows) + "\n")

    main_table("E2", paper.TABLE1, "Table 1 — E2, RLHF-heavy (80% RLHF, 64 GPUs)", recall=True)

    rows = []
    for base, vals in paper.TABLE2.items():
        short = {"SRTF-Est": "SRTF", "SJF-Est": "SJF"}.get(base, base)
        b, w = _row(s, "E4", base), _row(s, "E4", f"EvalStop+{short}")
        rows.append([base, _pair(_pct(vals[0]), _pct(_gain(b.jct_mean, w.jct_mean))),
                     _pair(_pct(vals[1]), _pct(_gain(b.ttfuc_mean, w.ttfuc_mean))),
                     _pair(_pct(vals[2]), _pct(_gain(b.wasted_frac, w.wasted_frac))),
                     _pair(_pct(vals[3]), _pct(w.precision)), _pair(_pct(vals[4]), _pct(w.fpr))])
    out.append("## Table 2 — E4, composability (improvement of EvalStop+base over base)\n\n"
               + _md(["Base", "JCT", "TTFUC", "Wasted", "Precision", "FPR"], rows) + "\n")

    rows = []
    for variant, vals in paper.TABLE3.items():
        b, w = _row(s, "E3", "SRTF-Est", variant), _row(s, "E3", "EvalStop+SRTF", variant)
        rows.append([variant, _pair(_pct(vals[1]), _pct(_gain(b.jct_mean, w.jct_mean))),
                     _pair(_pct(vals[2]), _pct(_gain(b.wasted_frac, w.wasted_frac))),
                     _pair(str(vals[3]), f"{w.stopped:.1f}"), _pair(_pct(vals[4]), _pct(w.precision)),
                     _pair(_pct(vals[5]), _pct(w.fpr))])
    out.append("## Table 3 — E3, workload sensitivity (EvalStop+SRTF vs SRTF-Est)\n\n"
               + _md(["Workload", "JCT gain", "Wasted reduction", "Stopped", "Precision", "FPR"], rows) + "\n")

    for table, exp, title in ((paper.TABLE4, "E7", "Table 4 — E7, eval-noise sensitivity"),
                              (paper.TABLE5, "E8", "Table 5 — E8, hacking-fraction sensitivity")):
        rows = []
        for (variant, det), vals in table.items():
            sched = {"StopAt0.65": "StopAt0.65+SRTF", "LossPlateau": "LossPlateau+SRTF",
                     "EvalStop": "EvalStop+SRTF"}[det]
            r = _row(s, exp, sched, variant)
            rows.append([variant, det, _pair(_pct(vals[0]), _pct(r.precision)), _pair(_pct(vals[1]), _pct(r.recall)),
                         _pair(_pct(vals[2]), _pct(r.fpr))])
        out.append(f"## {title}\n\n" + _md(["Variant", "Detector", "Precision", "Recall", "FPR"], rows) + "\n")

    main_table("E1", paper.TABLE7, "Table 7 — E1, mixed workload (50/30/20, 32 GPUs)", recall=False)

    rows = []
    for k, vals in paper.TABLE8.items():
        r = _row(s, "E5", "EvalStop+SRTF" if k == 2 else f"EvalStop(k={k})+SRTF")
        rows.append([str(k), _pair(_num(vals[0]), _num(r.jct_mean)), _pair(_num(vals[1]), _num(r.ttfuc_mean)),
                     _pair(_pct(vals[2]), _pct(r.wasted_frac)), _pair(str(vals[3]), f"{r.stopped:.1f}")])
    out.append("## Table 8 — E5, decline threshold k\n\n"
               + _md(["k", "JCT (min)", "TTFUC", "Wasted", "Stopped"], rows) + "\n")

    rows = []
    for variant, vals in paper.TABLE9.items():
        b, w = _row(s, "E6", "SRTF-Est", variant), _row(s, "E6", "EvalStop+SRTF", variant)
        rows.append([variant, _pair(_num(vals[0]), _num(w.jct_mean)), _pair(_pct(vals[1]), _pct(w.wasted_frac)),
                     _pair(_pct(vals[2]), _pct(w.saved_frac)),
                     _pair(_pct(vals[3]), _pct(_gain(b.jct_mean, w.jct_mean)))])
    out.append("## Table 9 — E6, RLHF eval interval (EvalStop+SRTF)\n\n"
               + _md(["Eval interval", "JCT (min)", "Wasted", "Saved", "JCT gain vs SRTF"], rows) + "\n")

    e2 = {name: _row(s, "E2", name) for name in ("SRTF-Est", "EvalSched", "EvalStop+SRTF")}
    out.append(DISCUSSION.format(
        saved=_pct(e2["EvalStop+SRTF"].saved_frac),
        gain=_pct(_gain(e2["SRTF-Est"].jct_mean, e2["EvalStop+SRTF"].jct_mean)),
        evalsched=e2["EvalSched"].jct_mean / e2["SRTF-Est"].jct_mean,
        wasted=_pct(e2["SRTF-Est"].wasted_frac),
        p=e2["EvalStop+SRTF"].jct_p_value,
    ))
    return "\n".join(out)


DISCUSSION = """## Where we match and where we do not

- **Detection quality** (the paper's central axis) reproduces closely: EvalStop's precision/recall/FPR on E2,
  its degradation with eval noise (E7) and its stability across hacking base rates (E8); StopAt's precision equals
  the hacking base rate and its FPR counts every healthy RLHF job; LossPlateau misses most hacking runs.
- **Orderings** reproduce: SRTF-Est < SJF-Est < FIFO on JCT, LossAware and EvalSched far worse than SRTF-Est,
  StopAt best on JCT but with unacceptable FPR, EvalStop improving JCT and wasted compute on every base (E4),
  its benefit growing with the RLHF share (E3), stops falling as k grows (E5) and savings shrinking as evals
  get rarer (E6).
- **Magnitudes** differ where the paper's text does not pin the model down. Our EvalStop saves {saved} of planned
  compute on E2 (paper 9.9%), so its JCT gain is {gain} (paper 9.4%): with evals every 15% of progress and the peak
  at 55-75%, two consecutive declines mostly land at the 90% or final checkpoint. EvalSched's JCT is {evalsched:.1f}x
  SRTF-Est's, not ~21x: our deprioritised jobs still finish once the queue drains, the paper's apparently
  kept being time-sliced. Wasted compute counts GPU-minutes after the last *useful* checkpoint (>=1% better than
  every earlier one), which puts SRTF-Est at {wasted} rather than 34.5%.
- The JCT p-value is Welch's t-test of per-job JCTs pooled over the five seeds; on E2 it is {p:.3g}.
"""
