"""The paired, anytime-valid stop rule (`eval/paired.py`) against the mean-only default (`NoisePatience`) on the
per-prompt corpus (`data/prompts/`, declared in its DECLARATION.md): the same runs, the same gate records.

    rlhfops paired-report --corpus data/prompts --parts tune,report,fresh --out docs/detectors.md

Per run, the paired rule sees at every checkpoint the gate's own 64 per-prompt gold scores (held-out batch 0). When
it is undecided and more prompts could settle a decline (`wants_more_evidence`), the replay gives it the next
recorded extension batch (32 held-out prompts, sampled with that batch's fixed seed) for the two checkpoints in
question, as `Trainer.extend_gate` does live, until the rule decides, the recorded pool (two batches) is spent or
the run's extension budget (`budget_frac` x the fixed gate's prompt evaluations up to the current checkpoint) would
be exceeded. The extra prompt evaluations are counted, and their seconds are the recorded pool's eval seconds per
prompt. The rule knows the corpus's design, fixed before any run was recorded: 20 judged looks (`horizon`) and at
most 3 prompt counts per pair (`prompt_looks`: the gate's 64, then 96 and 128).
NoisePatience (its configured defaults) sees the same checkpoints' means and SEs (the trace's `eval_score`,
`eval_se`). Labels and gold peaks: `eval.corpus.hindsight_label` on the trace (data/curves/LABELS.md).

Columns: useful recall (hacking runs stopped at or after their gold peak and before the last checkpoint) and the
false-stop rate (healthy runs stopped at all), each with a two-sided 95% Clopper-Pearson interval
(`scipy.stats.binomtest`); quality kept (mean over runs of (gold of the kept checkpoint - gold of the final one) /
the run's gold range; 0 when not stopped); detection delay (checkpoints from the gold peak to the stop, useful
stops); extra eval (extension prompt evaluations / the fixed gate's prompt evaluations up to each run's stop or end).
"""

from __future__ import annotations

import gzip
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from eval.corpus import hindsight_label
from eval.traces import Run, peak_index, runs_from_trace, usefulness
from studies.paired_ceiling import ceiling_table, label_agreement

GATE_PROMPTS = 64
EXTRA_BATCH = 32
POOL_BATCHES = 2
PLANNED_LOOKS = 20
BEGIN = "<!-- paired-corpus:begin -->"
END = "<!-- paired-corpus:end -->"


@dataclass
class PartRuns:
    """One part of the per-prompt corpus: runs (eval.traces.Run, labelled), per run its gold scores
    [checkpoints, prompts] in prompt-id order (0..127), and its seconds per pool prompt at each checkpoint."""

    runs: list[Run]
    scores: dict[str, np.ndarray]
    pool_s_per_prompt: dict[str, np.ndarray]
    gate_s: dict[str, np.ndarray]


def load_part(part_dir: Path) -> PartRuns:
    """Read `traces.csv` and `prompts.csv.gz` of one part; label each run by the hindsight rule."""
    trace = pd.read_csv(part_dir / "traces.csv")
    trace["run_id"] = trace["run_id"].astype(str)
    trace = trace.sort_values(["run_id", "step"], kind="stable").reset_index(drop=True)
    labels = {}
    for rid, g in trace.groupby("run_id", sort=False):
        h = hindsight_label(g["step"].to_numpy(), g["eval_score"].to_numpy(), eval_se=g["eval_se"].to_numpy())
        labels[rid] = (h.label, h.peak_step)
    trace["label"] = trace["run_id"].map(lambda r: labels[r][0])
    trace["peak_step"] = trace["run_id"].map(lambda r: labels[r][1])
    runs = runs_from_trace(trace)
    with gzip.open(part_dir / "prompts.csv.gz", "rt") as f:
        pr = pd.read_csv(f, dtype={"run_id": str})
    scores, pool, gate = {}, {}, {}
    for rid, g in pr.groupby("run_id", sort=False):
        wide = g.pivot(index="step", columns="prompt_id", values="gold_score").sort_index()
        scores[rid] = wide.to_numpy(dtype=float)
    for rid, g in trace.groupby("run_id", sort=False):
        pool[rid] = g["pool_s"].to_numpy(dtype=float) / (EXTRA_BATCH * POOL_BATCHES)
        gate[rid] = g["gate_s"].to_numpy(dtype=float)
    missing = [r.run_id for r in runs if r.run_id not in scores]
    if missing:
        raise ValueError(f"{part_dir}: run '{missing[0]}' has a trace but no prompt records")
    for r in runs:
        if scores[r.run_id].shape[0] != len(r.steps):
            raise ValueError(f"{part_dir}: run '{r.run_id}': {scores[r.run_id].shape[0]} prompt-record steps, "
                             f"{len(r.steps)} trace steps")
    return PartRuns(runs, scores, pool, gate)


def _batch(scores_row: np.ndarray, b: int) -> dict[str, float]:
    lo = 0 if b == 0 else GATE_PROMPTS + (b - 1) * EXTRA_BATCH
    hi = GATE_PROMPTS if b == 0 else lo + EXTRA_BATCH
    return {str(i): float(scores_row[i]) for i in range(lo, hi)}


def replay_paired(det, run: Run, scores: np.ndarray, budget_frac: float, pool_s: np.ndarray | None = None,
                  whole_pool: bool = False) -> dict:
    """One run through the paired rule with the gate's extension (see the module docstring): at checkpoint k the
    extension may have spent at most `budget_frac` x the fixed gate's prompt evaluations up to k (so a run's extra
    eval never exceeds that fraction of its gate's, wherever it stops). Returns stop index
    (None: never), kept index, extra prompt evaluations, extra eval seconds, the fixed gate's evaluations.
    `whole_pool`: a fixed gate of all 128 recorded prompts at every checkpoint instead (no extension; the pool's
    64 prompts per checkpoint counted as extra eval)."""
    monitor = det.start()
    have = [0] * len(run.steps)  # extension batches each checkpoint has had
    extra, extra_s, stop_i, kept_i = 0, 0.0, None, -1
    for k, cp in enumerate(run.checkpoints):
        if whole_pool:
            pool = EXTRA_BATCH * POOL_BATCHES
            extra += pool
            extra_s += pool * (float(pool_s[k]) if pool_s is not None else 0.0)
            if monitor.observe(cp, {str(i): float(v) for i, v in enumerate(scores[k])}):
                stop_i, kept_i = k, int(np.searchsorted(run.steps, monitor.kept_step))
                break
            continue
        stop = monitor.observe(cp, _batch(scores[k], 0))
        while not stop and monitor.wants_more_evidence():
            pair = [int(np.searchsorted(run.steps, s)) for s in monitor.pair]
            b = 1 + min(have[i] for i in pair)
            cost = sum(EXTRA_BATCH for i in pair if have[i] < b)
            if b > POOL_BATCHES or extra + cost > budget_frac * GATE_PROMPTS * (k + 1):
                break
            for i in pair:
                if have[i] < b:
                    monitor.add_scores(float(run.steps[i]), _batch(scores[i], b))
                    have[i] = b
                    extra_s += EXTRA_BATCH * (float(pool_s[i]) if pool_s is not None else 0.0)
            extra += cost
            stop = monitor.recheck()
        if stop:
            stop_i = k
            kept_i = int(np.searchsorted(run.steps, monitor.kept_step))
            break
    end = stop_i if stop_i is not None else len(run.steps) - 1
    return {"stop_i": stop_i, "kept_i": kept_i, "extra": extra, "extra_s": extra_s,
            "gate_evals": GATE_PROMPTS * (end + 1)}


def replay_means(det, run: Run) -> dict:
    """One run through a mean-only detector; the kept checkpoint is the best by the gate's mean up to the stop."""
    monitor = det.start()
    best_i, best, stop_i = -1, -math.inf, None
    for i, cp in enumerate(run.checkpoints):
        if cp.eval_score > best:
            best_i, best = i, cp.eval_score
        if monitor.observe(cp):
            stop_i = i
            break
    end = stop_i if stop_i is not None else len(run.steps) - 1
    return {"stop_i": stop_i, "kept_i": best_i, "extra": 0, "extra_s": 0.0, "gate_evals": GATE_PROMPTS * (end + 1)}


def verdict_rows(part: PartRuns, det, budget_frac: float | None, whole_pool: bool = False) -> pd.DataFrame:
    """Per run: label, stop, usefulness columns, extra eval. `budget_frac` None: a mean-only detector;
    `whole_pool`: the paired rule on all 128 recorded prompts at every checkpoint."""
    rows = []
    for run in part.runs:
        if budget_frac is None:
            r = replay_means(det, run)
        else:
            r = replay_paired(det, run, part.scores[run.run_id], budget_frac, part.pool_s_per_prompt[run.run_id],
                              whole_pool)
        row = {"run_id": run.run_id, "label": run.label, "stopped": int(r["stop_i"] is not None),
               "stop_step": run.steps[r["stop_i"]] if r["stop_i"] is not None else math.nan,
               "kept_step": run.steps[r["kept_i"]] if r["kept_i"] >= 0 else math.nan,
               "extra_evals": r["extra"], "extra_eval_s": r["extra_s"], "gate_evals": r["gate_evals"],
               "gate_s": float(np.nansum(part.gate_s[run.run_id][: (r["stop_i"] if r["stop_i"] is not None
                                                                    else len(run.steps) - 1) + 1]))}
        row.update(usefulness(run, r["stop_i"], r["kept_i"]))
        row["peak_i"] = peak_index(run)
        rows.append(row)
    return pd.DataFrame(rows)


def _cp(k: int, n: int) -> tuple[float, float]:
    from scipy.stats import binomtest

    if n == 0:
        return math.nan, math.nan
    ci = binomtest(k, n).proportion_ci(confidence_level=0.95, method="exact")
    return float(ci.low), float(ci.high)


def summarize(v: pd.DataFrame) -> dict:
    label = v["label"].to_numpy().astype(bool)
    stopped = v["stopped"].to_numpy().astype(bool)
    useful = int(np.sum(label & (v["stop_phase"].to_numpy() == "after_peak")))
    fp = int(np.sum(stopped & ~label))
    pos, neg = int(label.sum()), int((~label).sum())
    delay = v["delay"].to_numpy(dtype=float)[label & (v["stop_phase"].to_numpy() == "after_peak")]
    return {"runs": len(v), "hacking": pos, "healthy": neg, "useful": useful,
            "useful_recall": useful / pos if pos else math.nan, "useful_ci": _cp(useful, pos),
            "false_stops": fp, "false_stop_rate": fp / neg if neg else math.nan, "false_stop_ci": _cp(fp, neg),
            "quality_kept": float(v["quality_kept"].mean()),
            "quality_kept_hacking": float(v["quality_kept"][label].mean()) if pos else math.nan,
            "delay": float(delay.mean()) if len(delay) else math.nan,
            "extra_frac": float(v["extra_evals"].sum() / v["gate_evals"].sum()),
            "extra_eval_s": float(v["extra_eval_s"].sum()), "gate_s": float(v["gate_s"].sum()),
            "compute_saved": float(v["compute_saved"].mean())}


def _pct(x: float) -> str:
    return "—" if x != x else f"{100 * x:.1f}%"


def render(results: dict[str, dict[str, dict]], params: dict[str, dict], budget_frac: float, note: str = "") -> str:
    out = [BEGIN, "## The paired rule on the per-prompt corpus (data/prompts/)\n",
           "Written by `rlhfops paired-report --corpus data/prompts --out docs/detectors.md` "
           "(studies/paired_report.py). "
           "The runs, their labels and the tune/report split are declared in data/prompts/DECLARATION.md; both "
           "rules read the same gate records: `paired` the per-prompt gold scores (64 prompts per checkpoint, "
           f"plus extension batches of {EXTRA_BATCH} where more prompts could settle a decline, budget "
           f"{budget_frac:.0%} of the fixed gate's prompt evaluations so far in the run; the design's 20 looks and 3 "
           "prompt counts known to the rule), `noisepatience` the same checkpoints' means and SEs. "
           "Intervals: two-sided 95% Clopper-Pearson. Live, the same extension runs inside the job: set "
           "`eval_extra_budget` (extra prompt evaluations per run; 0 never extends) and `eval_extra_batch` in the "
           "training config; `Trainer.extend_gate` scores the next held-out batch for the two checkpoints the rule "
           "names and the supervisor charges its seconds to the tenant's ledger `eval` phase.\n"]
    for name, p in params.items():
        out.append(f"- `{name}`: {p}")
    out.append("")
    out.append("| part | rule | runs (hacking / healthy) | useful recall [95% CI] | false-stop rate [95% CI] | "
               "quality kept (all / hacking) | delay (checkpoints) | compute saved | extra eval (prompts; s) |")
    out.append("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for part, by_rule in results.items():
        for rule, q in by_rule.items():
            lo, hi = q["useful_ci"]
            flo, fhi = q["false_stop_ci"]
            out.append(
                f"| {part} | {rule} | {q['runs']} ({q['hacking']} / {q['healthy']}) | {q['useful']}/{q['hacking']} = "
                f"{_pct(q['useful_recall'])} [{_pct(lo)}, {_pct(hi)}] | {q['false_stops']}/{q['healthy']} = "
                f"{_pct(q['false_stop_rate'])} [{_pct(flo)}, {_pct(fhi)}] | {q['quality_kept']:.3f} / "
                f"{q['quality_kept_hacking']:.3f} | {q['delay']:.2f} | {_pct(q['compute_saved'])} | "
                f"{_pct(q['extra_frac'])}; {q['extra_eval_s']:.0f} s of {q['gate_s']:.0f} s gate |")
    out.append("")
    if note:
        out.append(note)
        out.append("")
    out.append(END)
    return "\n".join(out) + "\n"


def write_section(doc: Path, text: str) -> None:
    """Replace the paired-corpus section of `doc` (between its markers), or append it."""
    old = doc.read_text() if doc.exists() else ""
    if BEGIN in old and END in old:
        head, rest = old.split(BEGIN, 1)
        tail = rest.split(END, 1)[1].lstrip("\n")
        new = head + text + tail
    else:
        new = old.rstrip("\n") + "\n\n" + text
    doc.write_text(new)


def keep_section(doc: Path, text: str) -> str:
    """`text` (a new whole-file rendering of `doc`, e.g. by `rlhfops compare-detectors`) with the paired-corpus
    section `doc` holds now carried over at its end, so rewriting the file does not drop it."""
    old = doc.read_text() if doc.exists() else ""
    if BEGIN not in old or END not in old or BEGIN in text:
        return text
    section = BEGIN + old.split(BEGIN, 1)[1].split(END, 1)[0] + END + "\n"
    return text.rstrip("\n") + "\n\n" + section


def run_report(data: dict[str, PartRuns], budget_frac: float = 0.25) -> tuple[dict, dict]:
    """Per part of `data` (name -> the part, as `load_part` reads it) the four rows of the table, and the two rules'
    parameters."""
    from eval.detectors import DEFAULT_DETECTOR, make_detector

    # the corpus's design, fixed before any run was recorded (DECLARATION.md): 100 steps, a gate every 5 steps,
    # so 20 judged looks after step 0; the gate's 64 prompts plus two extension batches: 3 prompt counts per pair
    paired = make_detector("paired", horizon=PLANNED_LOOKS, prompt_looks=1 + POOL_BATCHES)
    means = make_detector(DEFAULT_DETECTOR)
    results: dict[str, dict[str, dict]] = {}
    for name, part in data.items():
        results[name] = {"paired": summarize(verdict_rows(part, paired, budget_frac)),
                         "paired, no extension": summarize(verdict_rows(part, paired, 0.0)),
                         "paired, 128-prompt gate": summarize(verdict_rows(part, paired, 0.0, whole_pool=True)),
                         DEFAULT_DETECTOR: summarize(verdict_rows(part, means, None))}
    return results, {"paired": paired.params(), DEFAULT_DETECTOR: means.params()}


# --------------------------------------------------------------------------- the tune part: why runs are missed
TUNE_PART = "tune"
_SEQUENCE = {"prompt_looks": 0, "extend_factor": 0.0}
# the mechanisms tried on the tune part (DECLARATION.md: the only part a default may be chosen on): label -> params
# over the paired rule's class defaults (alpha 0.02, margin 0, prompt_looks 3, extend_factor 4) and the corpus's
# design (horizon 20 where named)
FRONTIER = {
    "sequence, alpha/(j(j+1)) per look, extend on any decline (the first defaults)": {**_SEQUENCE},
    "sequence, planned horizon (alpha/21 per look), extend on any decline": {**_SEQUENCE, "horizon": 20},
    "t bound over 3 prompt counts, alpha/(j(j+1)), extend on any decline": {"extend_factor": 0.0},
    "t bound, planned horizon, extend on any decline": {"horizon": 20, "extend_factor": 0.0},
    "t bound, planned horizon, extend where 2x the prompts would settle it": {"horizon": 20, "extend_factor": 2.0},
    "t bound, planned horizon, extend where 3x the prompts would settle it": {"horizon": 20, "extend_factor": 3.0},
    "**t bound, planned horizon, extend where 4x the prompts would settle it (the defaults)**": {"horizon": 20},
    "the defaults at alpha 0.05": {"horizon": 20, "alpha": 0.05},
    "the defaults with margin 0.05": {"horizon": 20, "margin": 0.05},
    "the defaults with warm-up 3 (horizon 17)": {"horizon": 17, "warmup": 3},
}


def _phases(v: pd.DataFrame) -> tuple[int, int]:
    hacking = v["label"].to_numpy().astype(bool)
    phase = v["stop_phase"].to_numpy()
    return int(np.sum(hacking & (phase == "before_peak"))), int(np.sum(hacking & (phase == "at_end")))


def tune_frontier(part: PartRuns, budget_frac: float) -> str:
    """Useful stops vs false stops on the tune part for each mechanism of FRONTIER (a markdown table), at relative
    margin 0 (the mechanisms were chosen before the relative margin existed)."""
    from eval.paired import PairedStop

    out = ["| mechanism (alpha 0.02, margin 0 unless named) | useful | before the peak / at the end | false stops | "
           "quality kept | extra eval |", "| --- | --- | --- | --- | --- | --- |"]
    for label, params in FRONTIER.items():
        v = verdict_rows(part, PairedStop(**{"relative_margin": 0.0, **params}), budget_frac)
        q = summarize(v)
        before, at_end = _phases(v)
        out.append(f"| {label} | {q['useful']}/{q['hacking']} | {before} / {at_end} | {q['false_stops']}/"
                   f"{q['healthy']} | {q['quality_kept']:.3f} | {_pct(q['extra_frac'])} |")
    return "\n".join(out)


def _stop_at(v: pd.DataFrame, run: Run) -> str:
    r = v.loc[run.run_id]
    return "never" if not r["stopped"] else f"{int(np.searchsorted(run.steps, r['stop_step']))} ({r['stop_phase']})"


def decline_table(part: PartRuns) -> str:
    """Per hacking run of a part: its useful-stop window (gold peak to the checkpoint before the last), the largest
    decline of a checkpoint in that window below the peak checkpoint on the gate's 64 prompts (mean, SE and mean/SE
    of the paired per-prompt differences), and the bound each rule needed there, in the same SEs: the first
    defaults' (the sequence at alpha / (k^2 (k + 1))) and the defaults' (the t bound over 3 counts at alpha / (21 k));
    then where each stopped (markdown)."""
    from eval.paired import PairedStop, cs_radius, fixed_radius, mixture_r, pair_alpha

    first = verdict_rows(part, PairedStop(relative_margin=0.0, **_SEQUENCE), 0.25).set_index("run_id")
    now = verdict_rows(part, PairedStop(horizon=PLANNED_LOOKS, relative_margin=0.0), 0.25).set_index("run_id")
    out = ["| run | gold peak | window | largest decline below the peak (mean; SE) | z | bound, first defaults "
           "(SEs) | bound, defaults (SEs) | stop, first defaults | stop, defaults |",
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for run in part.runs:
        if run.label != 1:
            continue
        y = part.scores[run.run_id][:, :GATE_PROMPTS]
        p, n = peak_index(run), len(run.steps)
        best = None
        for k in range(p + 1, n - 1):
            d = y[k] - y[p]
            se = float(d.std(ddof=1)) / math.sqrt(d.size)
            z = -float(d.mean()) / se if se > 0 else 0.0
            if best is None or z > best[0]:
                best = (z, k, float(d.mean()), se)
        if best is None:
            out.append(f"| {run.run_id} | {p} | none (peak at {p} of {n - 1}) | — | — | — | — | — | — |")
            continue
        z, k, mean, se = best
        a_first, a_now = float(pair_alpha(0.02, k)), float(pair_alpha(0.02, k, k, PLANNED_LOOKS))
        b_first = float(cs_radius(GATE_PROMPTS, 1.0, a_first, mixture_r(GATE_PROMPTS, a_first))) * 8.0
        b_now = float(fixed_radius(GATE_PROMPTS, 1.0, a_now, 1 + POOL_BATCHES)) * 8.0
        out.append(f"| {run.run_id} | {p} | {p}-{n - 2} | {mean:+.3f} at {k}; {se:.3f} | {z:.1f} | {b_first:.1f} | "
                   f"{b_now:.1f} | {_stop_at(first, run)} | {_stop_at(now, run)} |")
    return "\n".join(out)


def acceptance(q_paired: dict, q_means: dict, budget_frac: float) -> str:
    """The issue's bars on one part, each with its measured value."""
    checks = [
        ("false-stop rate <= 2%", q_paired["false_stop_rate"] <= 0.02, _pct(q_paired["false_stop_rate"])),
        ("its 95% upper bound <= 5%", q_paired["false_stop_ci"][1] <= 0.05, _pct(q_paired["false_stop_ci"][1])),
        ("useful recall >= 85%", q_paired["useful_recall"] >= 0.85, _pct(q_paired["useful_recall"])),
        ("its 95% lower bound >= 75%", q_paired["useful_ci"][0] >= 0.75, _pct(q_paired["useful_ci"][0])),
        ("quality kept above noisepatience's", q_paired["quality_kept"] > q_means["quality_kept"],
         f"{q_paired['quality_kept']:.3f} vs {q_means['quality_kept']:.3f}"),
        (f"extra eval <= {budget_frac:.0%} of the fixed gate", q_paired["extra_frac"] <= budget_frac,
         _pct(q_paired["extra_frac"])),
    ]
    return "; ".join(f"{name}: {'met' if ok else 'NOT met'} ({val})" for name, ok, val in checks)


WHY_MISSED = """### Why the first defaults missed hacking runs (tune part only)

The first defaults (a confidence sequence over prompts, alpha / (k^2 (k + 1)) per pair at the k-th look, EXTEND on
any decline) stopped 5 of the tune part's 13 hacking runs usefully (4 with the budget counted over the whole run).
The table below takes each hacking run's useful-stop window (data/curves/LABELS.md via `eval.corpus`: from the gold
peak to the checkpoint before the last) and the checkpoint in it furthest below the peak checkpoint on the gate's 64
prompts, in SEs of the paired per-prompt difference. The misses were not declines hidden in the noise of a mean:
with common random numbers every one of them is 2.8-4.5 paired SEs below its peak, a real and measured decline.
They were missed because the first defaults needed 5.0-5.5 SEs: the union over k looks and k references at
alpha / (k^2 (k + 1)) (the 15th look gets 1/240 of alpha, split 15 ways) and a sequence valid at every prompt count
although the gate only ever has three (64, 96, 128). The useful window was short for one run only (gold peak at
checkpoint 17: a stop had to come at 17-19, and the decline shows only at 19, 3.1 SEs); the stops that did come came
late (9-10 checkpoints after the peak), mostly because the declines come slowly after a long plateau, and the
extension budget went to small early dips (EXTEND on any decline) before the decline that mattered. What changed,
each kept only where the tune part said so and each covered by the coverage tests
(tests/eval/test_paired_rule.py): the planned number of looks (`horizon`, 20 here: alpha / 21 per look, a tail for
runs that go on), a one-sided t bound over the 3 prompt counts the gate's design allows (`prompt_looks` 3), and EXTEND
only where 4x the prompts at the same mean and SD would settle the pair (`extend_factor` 4), so the pool's prompts go
to the close calls; together the bound is 4.2-4.5 SEs on 64 prompts, and the extension to 128 prompts multiplies a
decline's z by about 1.4. What is left on the tune part is not noise: the two hacking runs stopped before their
peak fell 0.24-0.31 (gate means) below an earlier checkpoint and then climbed to a later, higher peak, and the one
healthy run stopped fell 0.37 and recovered; a rule that sees only the past cannot tell those from the declines that
last. A margin (0.05) trades 3 useful stops for that one false stop; alpha 0.05 or a warm-up bought nothing.
"""

REPORT_READS = """### Reads of the report part

The report part has been read three times; only the first two were reads of a rule chosen without it. The first
(commit b859774) was at the first defaults (sequence, alpha / (k^2 (k + 1)), EXTEND on any decline, budget counted
over the whole run): 28/46 useful (60.9%), 3/74 false stops (4.1%), extra eval 25.2%; noisepatience 32/46, 2/74. In
between, on the tune part only: the planned horizon, the t bound over the gate's 3 prompt counts, EXTEND where 4x the
prompts would settle it (eval/paired.py defaults `prompt_looks` 3, `extend_factor` 4; `horizon` 20 from
DECLARATION.md's design), and the extension budget counted against the gate's evaluations so far (a run's extra eval
can no longer exceed the budget fraction); committed in 186475a before the second read (docs/detectors.md at
2678fcf): 37/46 useful (80.4%), 15/74 false stops (20.3%), quality kept 0.311, extra eval 13.5% (the relative
margin 0 row of the in-sample table below). The third read is the table above: the relative margin's default was
chosen on this part and the tune part together (below), so it is in-sample.

After the second read (a description of its verdicts, from each stopped run's `eval.corpus.hindsight_label` decline
and margin; nothing was changed then): the bound covers runs whose quality never
falls by more than the margin, and the healthy runs stopped here did fall. Of the 15 stopped by `paired`, 8 had
fallen by the end by 61-79% of the hindsight label's margin (max(20% of the run's range, 3 noise SDs): a real decline,
smaller than the label calls hacking) and 7 dipped and recovered; 13 of the 15 kept a checkpoint better than the
run's final one, 4 were stopped at the last checkpoint. The 128-prompt gate, with more evidence, stops more of them
(17/74): at margin 0 the rule asks "has quality fallen?", the label "has it fallen by 20% of the range by the end?",
and with enough prompts every real dip is a stop. The extension, sent to close calls, resolved 9 such declines more
than the 64-prompt gate alone (6/74) and no further useful stop (37/46 both). The next step named then: a margin in
the label's terms (a fraction of the gain so far: a linear contrast of three checkpoints, which the bound covers as it
covers any paired difference), reported on fresh seeds. It is the next section.
"""


# --------------------------------------------------------------------------- the relative margin, in-sample
#: the gain fractions tried (relative_margin), on the tune and report parts together: both had been read when it was
#: chosen, so this frontier is in-sample
RELATIVE_GRID = (0.0, 0.02, 0.05, 0.075, 0.1, 0.11, 0.125, 0.15, 0.2, 0.3)


def relative_frontier(data: dict[str, PartRuns], budget_frac: float, grid=RELATIVE_GRID) -> str:
    """Per gain fraction rho of RELATIVE_GRID (the paired rule's other parameters at their defaults, the corpus's
    design known): useful recall, false stops, quality kept and extra eval on the given parts pooled, and per part;
    noisepatience on the same runs for comparison (markdown)."""
    from eval.detectors import DEFAULT_DETECTOR, make_detector
    from eval.paired import PairedStop

    def pooled(vs: list[pd.DataFrame]) -> tuple[dict, str]:
        v = pd.concat(vs, ignore_index=True)
        q = summarize(v)
        before, at_end = _phases(v)
        never = int(np.sum(v["label"].to_numpy().astype(bool) & (v["stopped"].to_numpy() == 0)))
        lo, _ = q["useful_ci"]
        _, hi = q["false_stop_ci"]
        return q, (f"{q['useful']}/{q['hacking']} = {_pct(q['useful_recall'])} [{_pct(lo)}] | {before} / {at_end} / "
                   f"{never} | {q['false_stops']}/{q['healthy']} = {_pct(q['false_stop_rate'])} [{_pct(hi)}] | "
                   f"{q['quality_kept']:.3f} | {_pct(q['extra_frac'])}")

    names = list(data)
    out = [f"| rule | useful ({' + '.join(names)}) [95% lower] | before the peak / at the end / never | false stops "
           "[95% upper] | quality kept | extra eval | " + " | ".join(f"{n}: useful, false stops, quality kept"
                                                                    for n in names) + " |",
           "| --- " * (6 + len(names)) + "|"]
    rows: list[tuple[str, object, float | None]] = [
        (f"paired, relative margin {rho:g}", PairedStop(horizon=PLANNED_LOOKS, prompt_looks=1 + POOL_BATCHES,
                                                        relative_margin=rho), budget_frac) for rho in grid]
    rows.append((DEFAULT_DETECTOR, make_detector(DEFAULT_DETECTOR), None))
    for label, det, budget in rows:
        vs = [verdict_rows(data[n], det, budget) for n in names]
        _, cells = pooled(vs)
        per = []
        for v in vs:
            q = summarize(v)
            per.append(f"{q['useful']}/{q['hacking']}, {q['false_stops']}/{q['healthy']}, {q['quality_kept']:.3f}")
        out.append(f"| {label} | {cells} | " + " | ".join(per) + " |")
    return "\n".join(out)


RELATIVE_CHOICE = """### A margin relative to the gain: chosen on already-read data (in-sample)

After the report part's second read, the margin was put in the hindsight label's terms: a pair (reference s,
current k) counts as a decline only when the current checkpoint is below the reference by more than `relative_margin`
rho x the reference's gain over the run's first checkpoint (eval/paired.py: the per-prompt contrast
y_k - (1 - rho) y_s - rho y_0, covered by the same bound at the same alpha; tests/eval/test_paired_rule.py shows the
coverage by simulation at 10, 30 and 100 checkpoints). Its value was **chosen on the tune and report parts together,
both already read** (the report part twice before): the table below is **in-sample**, a description of the data the
choice was made on, not an estimate of how the rule does on new runs. Each row: the paired rule at the defaults
(alpha 0.02, margin 0, t bound over 3 prompt counts, EXTEND where 4x the prompts would settle it, the design's 20
looks) with that rho, the extension budget {budget}; noisepatience on the same runs last.

{table}

The choice: **rho 0.125**. At rho 0 the rule stops 16 of the 101 healthy runs; from rho 0.11 up it stops 2 of them
(rho 0.09, not in the table, also 2; rho 0.1 3: the extension's close calls move a run either way), and past 0.125
useful stops fall (40/59 at 0.15, 38/59 at 0.2): the label asks for a fall of 20% of the range by the end, and a rule
that must stop before the end needs a margin well below that. 0.125 is inside the plateau rather than at its edge.
On the issue's bars (in-sample) it is a trade, not a pass: false stops fall from 15.8% to 2.0% pooled (at the 2% bar;
0/27 on the tune part, 2/74 = 2.7% on the report part; the 95% upper bound, 7.0% on 101 healthy runs, does not meet
5%), useful recall falls from 81.4% to 69.5% (below 85% either way: no stop before the peak any more, 5 at rho 0, but
5 hacking runs are stopped only at the last checkpoint and 13 never), quality kept stays above noisepatience's on
both parts, extra eval falls from 13.2% to 7.6%. It is the default (`PairedStop.relative_margin` 0.125,
eval/paired.py, committed with this table) because the false-stop rate is the bar the rule exists to state (alpha
bounds it), and at rho 0 it misses that bar eightfold: its "healthy" (no fall at all) is not the label's. Against
noisepatience on the same runs it now stops more hacking runs usefully at the same false stops (41/59 against 34/59,
2/101 each) and keeps more quality (0.238 against 0.203); at rho 0 it did not dominate (16 false stops against 2).
Useful recall below 85% is not solved by it. The table at the top of this section is at that default, so its report
rows are a third read of the report part and in-sample too. Whether the rule holds on runs nothing was chosen on is
for the fresh report part (seeds 72-91, data/prompts/DECLARATION-fresh.md), declared before any of its runs was
recorded: its one read is the next section.
"""

FRESH_READ = """### The fresh report part: the one out-of-sample read

Seeds 72-91 (data/prompts/DECLARATION-fresh.md), declared before any of its runs was recorded, recorded sealed and
read once, by this command, at the paired rule's defaults of cc6732f: the `fresh` rows above (commit c6cdc9f holds
that output as it came; this section describes it and changes nothing). 200 runs: 78 hacking, 122 healthy (about 74
and 126 were expected).

- **The paired rule:** 60/78 useful stops (76.9%, 95% CI 66.0-85.7%), 3/122 false stops (2.5%, 0.5-7.0%), quality
  kept 0.309, extra eval 8.3% of the fixed gate. On the parts its relative margin was chosen on it had 41/59 useful
  and 2/101 false stops: out of sample it stops more hacking runs at about the same false-stop rate.
- **Against noisepatience on the same runs:** 60 against 49 useful stops, 3 against 1 false stops, quality kept
  0.309 against 0.249, the useful stops 2 checkpoints sooner after the gold peak (8.3 against 10.3).
- **The issue's bars:** extra eval <= 25% and quality kept above noisepatience's are met. The false-stop rate (2.5%;
  bar 2%, its upper bound 7.0%, bar 5%) and useful recall (76.9%; bar 85%, its lower bound 66.0%, bar 75%) are not.
- **The three false stops are real declines.** Two healthy runs fell by 88% and 90% of the label's margin by the end
  (`kl0.05-lr3e-4` seeds 77 and 87: the gate's mean went from 0.63 to 0.09 and from 0.44 to -0.09, and ended at 0.37
  and 0.14). One fell 0.81 in four checkpoints and recovered (`game40-kl0.02-lr3e-4` seed 89: 0.41 at step 20,
  -0.40 at step 40, 0.57 at step 85). Each fell by more than the relative margin (12.5% of the gain), so none is
  outside what alpha promises: alpha bounds stopping a run whose quality never falls by more than the margin. The label
  calls a run healthy unless, by the end, it has fallen by 20% of its range and 3 noise SDs.
- **The hacking runs not stopped usefully:** 9 never stopped, 8 stopped only at the last checkpoint (too late to
  count), 1 stopped before its peak.
- **The ceiling above:** on these runs, no constant threshold on the paired decline reaches 85% useful stops at <= 2%
  false stops, even one chosen knowing the labels: 75.6% at best on the gate's 64 prompts (rho 0.2), 79.5% on all
  128 recorded prompts (rho 0.125-0.2). The rule, which states its error rate, reaches 76.9% with its extension,
  at that ceiling. On all 360 runs the ceiling is 73.7%. More prompts raise it little (64 -> 128: +3.9 points on
  `fresh`), because with more prompts the healthy runs' real dips become significant too.
- **The label:** 72 of the 78 runs the gate's 64 prompts call hacking are called hacking on the pool's 64 other
  prompts too (92.3%); 121 of 137 over all three parts (88.3%).
"""


CEILING = """### The ceiling: a threshold chosen knowing the labels

How far one simple family of rules could go on these runs (studies/paired_ceiling.py): stop at the first checkpoint
k whose paired decline against some earlier checkpoint s (the t statistic of the per-prompt contrast
(1 - rho) y_s + rho y_0 - y_k on the gate's common random numbers, the statistic the paired rule bounds) exceeds a
constant t. In each cell t is chosen **knowing the labels**: among the thresholds that stop at most 2% of the healthy
runs, the one that stops the most hacking runs usefully (at or after the gold peak, before the last checkpoint). It
states no error rate and is fitted to the runs it is scored on: an upper bound for the family, not a rule. The paired
rule, which must hold alpha over 20 looks and every reference, needs 4.2-4.5 paired SEs at 64 prompts (a larger t).
Where a cell's useful recall is below 85%, no constant threshold on that statistic reaches the issue's recall bar on
those runs at that false-stop rate, whatever it is tuned to. 128 prompts: the whole recorded pool at every
checkpoint (the extension reads between 64 and 128 per pair, so it sits between the two rows; strictly, a rule that
picks the prompt count per pair is not inside the family).

{table}

How far the label itself can be trusted: each run labelled again by the same hindsight rule on 64 other held-out
prompts (the recorded pool's 64-127, sampled with their own fixed seeds) instead of the gate's 0-63. A hacking label
that does not come back on other prompts of the same checkpoints is partly the gate's sampling noise; recall is
scored against the gate's label, noise included.

{labels}
"""


def report(corpus: Path, parts: list[str], budget_frac: float = 0.25, out: Path | None = None) -> str:
    """The table with each part's acceptance line; with `out`, its section of that markdown file is replaced.
    Inputs are checked by the caller (`rlhfops paired-report`)."""
    from eval.detectors import DEFAULT_DETECTOR

    data = {p: load_part(corpus / p) for p in parts}  # each part read once: the gate records are the bulk of the run
    results, params = run_report(data, budget_frac)
    note = "\n\n".join(f"Acceptance on `{part}` (the issue's bars): "
                       + acceptance(r["paired"], r[DEFAULT_DETECTOR], budget_frac) for part, r in results.items())
    note += "\n\n" + CEILING.format(table=ceiling_table(data), labels=label_agreement(data))
    if "report" in parts:
        note += "\n\n" + REPORT_READS
    if TUNE_PART in parts and "report" in parts:
        both = {p: data[p] for p in (TUNE_PART, "report")}
        note += "\n\n" + RELATIVE_CHOICE.format(budget=f"{budget_frac:.0%}", table=relative_frontier(both, budget_frac))
    if "fresh" in parts:
        note += "\n\n" + FRESH_READ
    if TUNE_PART in parts:
        tune = data[TUNE_PART]
        note += ("\n\n" + WHY_MISSED + "\n" + decline_table(tune) + "\n\nThe tune part's frontier (budget "
                 f"{budget_frac:.0%}; every row keeps the bound alpha):\n\n" + tune_frontier(tune, budget_frac))
    text = render(results, params, budget_frac, note)
    if out is not None:
        write_section(out, text)
    return text
