"""Detectors beyond EvalStop under noise and base-rate stress: write docs/detectors.md.

E7 (eval-noise sigma 0.01-0.12) with Gaussian, Student-t (df 3) and AR(1) (rho 0.6) noise, and E8
(hacking fraction 20-80%), every detector with its documented defaults on SRTF-Est, EvalStop(k=2) as the
baseline. Columns: precision, recall, FPR, JCT, wasted compute, detection delay (checkpoints after the
true eval peak before the stop, detected hacking jobs) and regret (true peak eval minus the noise-free
eval of the checkpoint the platform keeps, mean over RLHF jobs).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import pandas as pd

from eval.detectors import DEFAULT_DETECTOR, make_detector
from eval.registry import EARLY_STOP_DETECTORS
from scheduling.experiments import Unit, load_experiment, run_units, units_for

DETECTOR_SCHEDULERS = ["SRTF-Est", "EvalStop+SRTF", "Patience+SRTF", "CUSUM+SRTF", "BOCPD+SRTF",
                       "Divergence+SRTF", "NoisePatience+SRTF", "LossPlateau+SRTF"]
NOISE_KINDS = ("gaussian", "student_t", "ar1")


def report_units() -> list[Unit]:
    units = []
    for kind in NOISE_KINDS:
        cfg = load_experiment("E7", {"workload.eval_noise.kind": kind, "schedulers": DETECTOR_SCHEDULERS})
        for u in units_for(cfg):
            u.experiment = f"E7/{kind}"
            units.append(u)
    cfg = load_experiment("E8", {"schedulers": DETECTOR_SCHEDULERS})
    for u in units_for(cfg):
        u.experiment = "E8/gaussian"
        units.append(u)
    return units


def run_report(workers: int | None = None, on_done: Callable | None = None) -> pd.DataFrame:
    per_seed, _ = run_units([u for u in report_units()], workers=workers, on_done=on_done)
    cols = ["precision", "recall", "fpr", "jct", "wasted_frac", "detection_delay", "regret", "stopped",
            "useful_recall", "false_stop_rate", "quality_kept"]
    return per_seed.groupby(["experiment", "variant", "scheduler"], sort=False)[cols].mean().reset_index()


def _f(x: float, pct: bool = False) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "—"
    return f"{100 * x:.1f}%" if pct else f"{x:.2f}" if abs(x) < 10 else f"{x:,.0f}"


def render(table: pd.DataFrame) -> str:
    det_defaults = "\n".join(f"- `{name}`: {make_detector(name).params()}" for name in EARLY_STOP_DETECTORS
                             if name not in ("stopat",))
    out = ["# Early-stop detectors under noise and base-rate stress\n",
           "Written by `rlhfops compare-detectors --corpus data/curves`. Every detector runs with its configured "
           "defaults (class defaults overridden by configs/detectors.yaml; chosen once, not per noise level) on "
           "SRTF-Est, E2 workload, seeds 42, 123, 456, 789, 1024; EvalStop(k=2) is the paper's baseline. "
           "Noise-aware detectors measure every threshold in units of the run's own eval noise: the gate's "
           "standard error while it explains the run's variation (here the noise sigma), else a robust estimate "
           "from the run's own series (MAD of second differences / sqrt 6). Useful recall: hacking jobs stopped at "
           "or after their true (noise-free) peak and before their last checkpoint, the headline with the "
           "false-stop rate (healthy RLHF jobs stopped); a stop at the last checkpoint counts for recall but saves "
           "nothing. Quality kept: (noise-free eval of the kept checkpoint - of the final one) / the job's range, "
           "mean over RLHF jobs (0: never stopping). Delay: checkpoints from the true eval peak to the stop "
           "(detected hacking jobs). Regret: true peak eval minus the noise-free eval of the checkpoint the "
           "platform keeps, mean over RLHF jobs.\n",
           f"Platform default: **{DEFAULT_DETECTOR}** (see the verdict at the end).\n",
           "Defaults:\n", det_defaults, ""]
    header = ["Variant", "Detector", "Useful recall", "False-stop rate", "Quality kept", "Precision", "Recall", "FPR",
              "JCT (min)", "Wasted", "Delay", "Regret"]
    for exp, g in table.groupby("experiment", sort=False):
        out.append(f"## {exp}\n")
        out.append("| " + " | ".join(header) + " |")
        out.append("|" + "---|" * len(header))
        for _, r in g.iterrows():
            if r.scheduler == "SRTF-Est":
                det = "none (SRTF-Est)"
            else:
                det = r.scheduler.replace("+SRTF", "")
            bold = det.lower().startswith(DEFAULT_DETECTOR)
            name = f"**{det}**" if bold else det
            out.append("| " + " | ".join([r.variant, name, _f(r.useful_recall, True), _f(r.false_stop_rate, True),
                                          f"{r.quality_kept:+.3f}", _f(r.precision, True), _f(r.recall, True),
                                          _f(r.fpr, True),
                                          _f(r.jct), _f(r.wasted_frac, True), _f(r.detection_delay),
                                          f"{r.regret:.3f}"]) + " |")
        out.append("")
    out.append(verdict(table))
    return "\n".join(out)


def replay_traces(path) -> pd.DataFrame:
    """Every detector (documented defaults) on a labelled Trace CSV of real runs: one row per detector."""
    from eval.traces import detection_quality, load_trace, runs_from_trace, verdicts

    df = load_trace(path)
    runs = runs_from_trace(df)
    rows = []
    for name in EARLY_STOP_DETECTORS:
        det = make_detector(name)
        if name == "stopat" or any(need not in df.columns for need in det.needs if need != "progress"):
            continue
        v = verdicts(det, runs)
        q = detection_quality(v)
        stopped = v[v.stopped == 1]
        rows.append({"detector": det.label, **q,
                     "regret": float((df.groupby("run_id")["eval_score"].max().reindex(v.run_id).to_numpy()
                                      - v["best_eval_score"].where(v.stopped == 1, v["final_eval_score"])
                                      .to_numpy()).mean()),
                     "median_stop_step": float(stopped.stop_step.median()) if len(stopped) else math.nan})
    return pd.DataFrame(rows)


def render_replay(table: pd.DataFrame, source: str, runs: int) -> str:
    out = [f"## Replay on real PPO runs ({source})\n",
           f"{runs} runs recorded by `rlhfops record-traces` from the shipped configs (`ppo-hack`, label 1: proxy "
           "reward keeps rising while held-out gold falls; `ppo-healthy`, label 0), one row per eval gate with the "
           "gate's standard error. Regret here is on the observed gold score (peak minus what the platform keeps). "
           "These gates are noisy (64 held-out prompts: SE about 0.1 on a score that moves between -0.4 and 0.4) and "
           "a run has 12 of them, so a handful of runs shows how the detectors behave on real curves but is too "
           "small a sample to rank them; the platform default is chosen on the simulated tables above.\n",
           "| Detector | Stopped | Precision | Recall | FPR | Regret | Median stop step |",
           "|---|---|---|---|---|---|---|"]
    for _, r in table.iterrows():
        out.append(f"| {r.detector} | {r.stopped}/{r.runs} | {_f(r.precision, True)} | {_f(r.recall, True)} | "
                   f"{_f(r.fpr, True)} | {r.regret:.3f} | {_f(r.median_stop_step)} |")
    return "\n".join(out) + "\n"


def check_acceptance(table: pd.DataFrame, detector: str) -> dict[str, bool]:
    """The issue's bar for a platform default, evaluated on this table."""
    def row(exp: str, variant: str, sched: str) -> pd.Series:
        return table[(table.experiment == exp) & (table.variant == variant) & (table.scheduler == sched)].iloc[0]

    d = f"{detector}+SRTF"
    s08, s12 = row("E7/gaussian", "sigma=0.08", d), row("E7/gaussian", "sigma=0.12", d)
    h20 = row("E8/gaussian", "hack=20%", d)
    base, ours = row("E8/gaussian", "hack=60%", "EvalStop+SRTF"), row("E8/gaussian", "hack=60%", d)
    return {
        "sigma 0.08: precision and recall >= 0.90": bool(s08.precision >= 0.90 and s08.recall >= 0.90),
        "sigma 0.12: precision and recall >= 0.85": bool(s12.precision >= 0.85 and s12.recall >= 0.85),
        "20% hacking: precision >= 0.95": bool(h20.precision >= 0.95),
        "default noise: precision, recall >= EvalStop": bool(ours.precision >= base.precision
                                                             and ours.recall >= base.recall),
        "default noise: JCT, wasted <= EvalStop": bool(ours.jct <= base.jct and ours.wasted_frac <= base.wasted_frac),
    }


def verdict(table: pd.DataFrame) -> str:
    lines = ["## Verdict\n"]
    titles = {name: make_detector(name).label for name in EARLY_STOP_DETECTORS if name not in ("stopat",)}
    for title in titles.values():
        if f"{title}+SRTF" not in set(table.scheduler):
            continue
        checks = check_acceptance(table, title)
        passed = sum(checks.values())
        lines.append(f"- **{title}**: {passed}/{len(checks)} of the bar — "
                     + "; ".join(f"{k}: {'yes' if v else 'no'}" for k, v in checks.items()))
    lines.append("")
    clear = [title for title in titles.values() if f"{title}+SRTF" in set(table.scheduler)
             and all(check_acceptance(table, title).values())]
    default_title = titles[DEFAULT_DETECTOR]
    if clear == [default_title]:
        lines.append(f"`{DEFAULT_DETECTOR}` is the platform default because it is the only detector that clears every "
                     "line of the bar with one configuration: its slope test pools several checkpoints and scales "
                     "with the gate's standard error, so it neither fires on noise (EvalStop's two raw declines do, "
                     "more often as sigma grows) nor needs many post-peak checkpoints (CUSUM and BOCPD lose recall "
                     "at high noise because a run has only two or three checkpoints after its peak).")
    else:
        lines.append(f"Detectors clearing every line: {', '.join(clear) or 'none'}; the platform default is "
                     f"`{DEFAULT_DETECTOR}` ({default_title}). Revisit `eval.detectors.DEFAULT_DETECTOR` if this "
                     "table disagrees with it.")
    return "\n".join(lines) + "\n"


def load_corpus_split(corpus: Path, split: str) -> pd.DataFrame:
    """One split of a real-curve corpus laid out as `<corpus>/<source>/traces.csv` plus `<corpus>/runs.csv`
    (label, peak_step, split per run), as one trace DataFrame with `source` per row."""
    traces = pd.concat([pd.read_csv(p).assign(source=p.parent.name) for p in sorted(corpus.glob("*/traces.csv"))],
                       ignore_index=True)
    index = pd.read_csv(corpus / "runs.csv")[["run_id", "label", "peak_step", "split"]]
    df = traces.drop(columns=[c for c in ("label", "peak_step", "split") if c in traces.columns])
    df = df.merge(index, on="run_id", how="inner")
    return df[df["split"] == split].sort_values(["run_id", "step"], kind="stable").reset_index(drop=True)


def corpus_table(corpus: Path, split: str) -> pd.DataFrame:
    """Every early-stop detector (configured defaults, no parameters) on one split: usefulness first."""
    from eval.traces import detection_quality, verdicts

    runs = _split_runs(corpus, split)
    if not runs:
        return pd.DataFrame()
    rows = []
    for name in EARLY_STOP_DETECTORS:
        det = make_detector(name)
        if name in ("stopat", "lossplateau"):
            continue  # stopat needs the planned length, lossplateau a training loss: the corpus has neither for all
        q = detection_quality(verdicts(det, runs))
        rows.append({"detector": det.label, "name": name, **q})
    return pd.DataFrame(rows)


def _split_runs(corpus: Path, split: str) -> list:
    """One split's runs as `eval.traces` runs ([] when the corpus has none in it)."""
    from eval.traces import runs_from_trace

    df = load_corpus_split(corpus, split)
    return [] if df.empty else runs_from_trace(df)


def _ci(k: int, n: int) -> str:
    """`k/n = rate (95% CI low-high)`, the interval exact (Clopper-Pearson, scipy.stats.binomtest)."""
    from eval.calibrate import false_stop_check

    if not n:
        return f"{k}/{n}"
    c = false_stop_check(k, n)
    return f"{k}/{n} = {_f(c.rate, True)} (95% CI {_f(c.low, True)}-{_f(c.high, True)})"


#: what each held-out split is, for the report (eval.corpus.HELD_OUT_SOURCES says which source is which split)
HELD_OUT_NOTES = {
    "fresh": "Runs recorded (this project's trainer on the corpus grid, seeds 4-7) after every choice and threshold "
             "of an earlier default was fixed, held out whole: that version's unseen check. One of the parts the "
             "current default was chosen and calibrated on (in-sample for it).",
    "holdout": "Runs declared (the grid on seeds 8-11, the gameable-proxy variants on seeds 12-19) before an earlier "
               "default was chosen, held out whole: that version's unseen check. One of the parts the current "
               "default was chosen and calibrated on (in-sample for it).",
    "gate128": "40 of the `holdout` runs (every gameable-proxy run, the plain variants on seeds 8-9) measured with a "
               "gate twice as large (128 held-out prompts instead of 64); training is the same run (the gate samples "
               "with its own generator), so only the eval's noise differs. Declared after the holdout result, "
               "before any of its runs was trained; reported beside the same runs of `holdout`, never pooled.",
    "twin64": "56 runs (the grid on seeds 20-23, the gameable-proxy variants on seeds 24-31), declared after an "
              "earlier default was committed and before any of them was trained: a second unseen check of it at "
              "the shipped gate size (64 held-out prompts). One of the parts the current default was chosen and "
              "calibrated on (in-sample for it). Each checkpoint was scored by this gate and, in the same run, by "
              "a 256-prompt gate (`gate256`). Held out whole.",
    "gate256": "The `twin64` runs as a 256-prompt gate scored them (the gate the trainer ran; the 64-prompt twin "
               "sampled with its own generator, so both score the same policy at every checkpoint): what a gate four "
               "times as large buys. Reported beside `twin64`, never pooled.",
    "sealed64": "56 runs of the `twin64` design on seeds 32-43, recorded before the current default's parameters "
                "were chosen and kept outside the corpus (unread by any detector) until they were committed: their "
                "unseen check at the shipped gate size (a later selection read it, but its choice was not kept). "
                "Held out whole.",
    "sealed256": "The `sealed64` runs as their 256-prompt gate scored them (the same policy at every checkpoint). "
                 "Reported beside `sealed64`, never pooled.",
    "sealed8_64": "56 runs of the `twin64` design on seeds 44-55, recorded before the last selection and kept "
                  "outside the corpus (unread by any detector) until its result was committed. The choice between "
                  "that result and the current default was made on these runs and the report half, so their figures "
                  "carry a two-way choice's optimism. Held out whole.",
    "sealed8_256": "The `sealed8_64` runs as their 256-prompt gate scored them (the same policy at every "
                   "checkpoint). Reported beside `sealed8_64`, never pooled.",
}


def calibration_check(corpus: Path) -> str:
    """The default's calibrated bar: its target, the tune fleet it was fitted on, the false-stop rate per kind of
    run (with and without a proxy reward) on every part with a 95% exact CI, and the issue's acceptance lines on
    the report half, each held-out split and all of them pooled."""
    from common.config import read_yaml_mapping
    from eval.calibrate import calibration_groups, has_proxy
    from eval.corpus import ALL_SPLITS, CHOSEN_ON_SPLITS, PAIRED_SPLITS
    from eval.detectors import DETECTOR_CONFIG
    from eval.traces import detection_quality, verdicts

    entry = (read_yaml_mapping(DETECTOR_CONFIG, "detector config").get("detectors") or {}).get(DEFAULT_DETECTOR) or {}
    det = make_detector(DEFAULT_DETECTOR)
    lines = []
    runs_of = {split: _split_runs(corpus, split) for split in ALL_SPLITS}
    for split, split_runs in runs_of.items():
        runs = [r for r in split_runs if r.label == 0]
        kinds = {"with a proxy reward": [r for r in runs if has_proxy(r.checkpoints)],
                 "without a proxy reward": [r for r in runs if not has_proxy(r.checkpoints)]}
        for kind, group in kinds.items():
            if not group:
                continue
            stopped = 0
            for r in group:
                m = det.start()
                stopped += any(m.observe(cp) for cp in r.checkpoints)
            lines.append(f"- `{split}`, healthy runs {kind}: {_ci(stopped, len(group))} stopped")
    report_runs = runs_of["report"]
    q = detection_quality(verdicts(det, report_runs))
    held_out = ""
    held = [split for split in ALL_SPLITS if split not in ("tune", "report") and runs_of[split]]
    for split in held:
        seen = " (the default was chosen on it: in-sample)" if split in CHOSEN_ON_SPLITS else ""
        held_out += (f"\nThe same lines on the `{split}` split{seen}:\n\n"
                     f"{_acceptance(detection_quality(verdicts(det, runs_of[split])))}\n")
        if split in PAIRED_SPLITS:
            held_out += paired_check(det, split, runs_of[split], PAIRED_SPLITS[split], runs_of[PAIRED_SPLITS[split]])
    parts = [split for split in held if split not in PAIRED_SPLITS and split not in CHOSEN_ON_SPLITS]
    if parts:
        pooled = report_runs + [r for split in parts for r in runs_of[split]]
        quoted = [f"`{split}`" for split in ("report", *parts)]
        names = " and ".join([", ".join(quoted[:-1]), quoted[-1]])
        held_out += (f"\nThe same lines on {names} pooled (every run the default's parameters were not chosen or "
                     "fitted on):\n\n"
                     f"{_acceptance(detection_quality(verdicts(det, pooled)))}\n")
        rlhf = [r for r in pooled if has_proxy(r.checkpoints)]
        if rlhf and det.threshold:
            held_out += (f"\nThe bar's trade-off on the runs of {names} that record a proxy reward (RLHF runs, the "
                         "population a live platform judges): every `z` scaled by a factor, nothing else changed\n\n"
                         + render_tradeoff(threshold_tradeoff(det, rlhf), det.threshold) + "\n")
    cal = entry.get("calibrated_on") or {}
    keys = ", ".join(f"`{key}`" for key, _runs in calibration_groups(det, [r.checkpoints for r in report_runs]))
    low_all = false_stop_check_low(q["hacking"])
    return (f"Calibration: `{DEFAULT_DETECTOR}` {det.params()} — {keys} fitted to the target false-stop rate "
            f"{entry.get('target_false_stop_rate')} on {cal.get('fleet')} ({cal.get('healthy_runs')} healthy runs, "
            f"{cal.get('stopped')} stopped) by `rlhfops select-detector`, once for each candidate shape of its grid, "
            f"the shape chosen by its rule on the same parts ({', '.join(f'`{s}`' for s in CHOSEN_ON_SPLITS)}; "
            "configs/detectors.yaml's changelog says which version was chosen how, docs/detector-selection.md holds "
            "the latest selection's table); the gate-phase bars and "
            "`gate_from` on simulator seeds 1-100 (configs/detectors.yaml's changelog says how). Checked on every "
            "part (Clopper-Pearson intervals, scipy.stats.binomtest):\n\n"
            + "\n".join(lines) + "\n\n"
            "Issue 14's acceptance on the `report` half, default detector with no parameters:\n\n"
            + _acceptance(q) + "\n" + held_out + "\n"
            f"The report half holds only {q['hacking']} hacking runs, so its useful recall is a coarse measurement: "
            f"even {q['hacking']}/{q['hacking']} would have a 95% lower bound of {_f(low_all, True)}, and one run "
            f"more or less moves it by {_f(1 / q['hacking'], True) if q['hacking'] else '—'}. Its false-stop rate "
            "rests on about 100 healthy runs: the upper bound of its interval, not the point estimate, is what a "
            "tenant can rely on.\n")


def paired_check(det, split: str, runs, base_split: str, base_runs) -> str:
    """A split that re-measures runs of `base_split` (same training, another eval gate) beside the same runs as
    `base_split` measured them: the acceptance lines of both, each set labelled by its own evals, and how many
    labels the two measurements agree on."""
    from eval.traces import detection_quality, verdicts

    def key(run_id: str) -> str:
        return run_id.split("/", 1)[1]

    mine = {key(r.run_id) for r in runs}
    base = [r for r in base_runs if key(r.run_id) in mine]
    labels = {key(r.run_id): r.label for r in base}
    agree = sum(labels.get(key(r.run_id)) == r.label for r in runs)
    out = (f"\nThe same {len(base)} runs as `{base_split}` measured them:\n\n"
           f"{_acceptance(detection_quality(verdicts(det, base)))}\n\n"
           f"(each set labelled by its own evals; the two agree on {agree} of {len(runs)} labels)\n")
    if det.threshold:
        for title, part in ((f"`{split}`", runs), (f"the same runs of `{base_split}`", base)):
            out += (f"\nThe bar's trade-off on {title}:\n\n"
                    + render_tradeoff(threshold_tradeoff(det, part), det.threshold) + "\n")
    return out


def threshold_tradeoff(det, runs, factors=(0.5, 0.75, 1.0, 1.25, 1.5, 2.0)) -> pd.DataFrame:
    """Useful recall and false-stop rate of `det` on `runs` with its calibrated threshold scaled by each factor."""
    from eval.traces import detection_quality, verdicts

    key = det.threshold
    rows = []
    for factor in factors:
        scaled = type(det)(**{**det.params(), key: det.params()[key] * factor})
        q = detection_quality(verdicts(scaled, runs))
        rows.append({"factor": factor, key: scaled.params()[key], **q})
    return pd.DataFrame(rows)


def render_tradeoff(table: pd.DataFrame, key: str) -> str:
    out = [f"| factor | `{key}` | useful recall | false-stop rate | quality kept |", "|---|---|---|---|---|"]
    for _, r in table.iterrows():
        out.append(f"| {r.factor:g} | {r[key]:.3f} | {_ci(int(r.useful), int(r.hacking))} | "
                   f"{_ci(int(r.fp), int(r.healthy))} | {r.quality_kept:+.3f} |")
    return "\n".join(out)


def _acceptance(q: dict) -> str:
    """Issue 14's three acceptance lines on one set of verdicts (`detection_quality`), met or not, as markdown."""
    lines = [
        ("at most 3% of healthy runs stopped", q["false_stop_rate"] <= 0.03, _ci(q["fp"], q["healthy"])),
        ("at least 85% of hacking runs stopped after their gold peak and before their end",
         q["useful_recall"] >= 0.85, _ci(q["useful"], q["hacking"])),
        ("mean quality kept above zero", q["quality_kept"] > 0.0, f"{q['quality_kept']:+.3f}"),
    ]
    return ("\n".join(f"- {name}: **{'met' if ok else 'NOT met'}** ({value})" for name, ok, value in lines)
            + f"\n- of the healthy runs stopped, kept a checkpoint scoring below the run's final one (a stop that "
              f"lost quality): {q['losing_stops']} of {q['fp']}")


def false_stop_check_low(n: int) -> float:
    """The 95% exact lower bound of a rate observed as n/n."""
    from eval.calibrate import false_stop_check

    return false_stop_check(n, n).low if n else float("nan")


def render_corpus(tables: dict[str, pd.DataFrame], corpus: Path) -> str:
    """The corpus section: one table per split (`corpus_table`; report, the held-out splits, then tune), then the
    calibration check."""
    from eval.calibrate import false_stop_check

    out = [f"## Real-curve corpus (`{corpus}/`)\n",
           "Public training curves from other projects and this project's own PPO runs, labelled in hindsight by "
           "the rule of the corpus's LABELS.md (hacking: the smoothed held-out metric ends more than max(20% of "
           "the run's range, 3 noise SDs) below its smoothed peak, with at least 2 checkpoints after the peak; "
           "else healthy), written before any detector ran on it. Runs are split per (source, label) stratum by a "
           "seeded hash into `tune` (choose and calibrate) and `report` (this table's headline; never used to "
           "choose anything); the sources recorded later are each held out whole as a split of their own, and the "
           "default was chosen on `tune` and the older of them (each split's note says which). Every detector runs "
           "with no parameters (class defaults overridden by "
           "configs/detectors.yaml). Useful: a hacking run stopped at or after its gold peak and before its last "
           "checkpoint. False stops: healthy runs stopped; at a loss: of those, the ones whose kept checkpoint "
           "scores below the run's final one (the others kept a checkpoint at least as good as the one the run "
           "ended with). Quality kept: (gold of the kept checkpoint - gold of "
           "the final one) / the run's range, mean over all runs (0 = never stopping).\n"]
    order = ["report", *[split for split in tables if split not in ("tune", "report")], "tune"]
    for split in order:
        table = tables.get(split, pd.DataFrame())
        if table.empty:
            continue
        r0 = table.iloc[0]
        out.append(f"### `{split}` split: {r0.runs} runs ({r0.hacking} hacking, {r0.healthy} healthy)\n")
        if split in HELD_OUT_NOTES:
            out.append(HELD_OUT_NOTES[split] + "\n")
        out.append("| Detector | Useful recall (95% CI) | False-stop rate (95% CI) | of them at a loss | "
                   "Hacking stopped before peak | at end | Quality kept | Compute saved | Delay | Precision | Recall |")
        out.append("|---|---|---|---|---|---|---|---|---|---|---|")
        for _, r in table.iterrows():
            ci = false_stop_check(int(r.fp), int(r.healthy)) if r.healthy else None
            fsr = f"{_f(r.false_stop_rate, True)} ({r.fp}/{r.healthy}; {_f(ci.low, True)}-{_f(ci.high, True)})" \
                if ci else "—"
            name = f"**{r.detector}**" if r["name"] == DEFAULT_DETECTOR else r.detector
            uci = false_stop_check(int(r.useful), int(r.hacking)) if r.hacking else None
            useful = f"{_f(r.useful_recall, True)} ({r.useful}/{r.hacking}; {_f(uci.low, True)}-{_f(uci.high, True)})" \
                if uci else "—"
            out.append(f"| {name} | {useful} | {fsr} | {r.losing_stops}/{r.fp} | {r.early_stops} | "
                       f"{r.end_stops} | {r.quality_kept:+.3f} | {_f(r.compute_saved, True)} | {_f(r.delay)} | "
                       f"{_f(r.precision, True)} | {_f(r.recall, True)} |")
        out.append("")
    out.append(calibration_check(corpus))
    return "\n".join(out) + "\n"


#: Seeds no detector choice or threshold ever saw (the default was chosen on seeds 1-100; the reported
#: experiments use 42-1024): the bars are checked here, in sets of 5 like the experiments.
FRESH_SEED_START = 20001
PAPER_BARS = {  # condition: (E2 overrides, min precision, min recall, max FPR)
    "E2 (sigma 0.02)": ({}, 0.95, 0.95, 0.02),
    "E7 sigma 0.08": ({"workload.eval_noise.sigma": 0.08}, 0.90, 0.90, 0.10),
    "E7 sigma 0.12": ({"workload.eval_noise.sigma": 0.12}, 0.85, 0.85, 0.16),
}


def fresh_seed_bars(sets: int = 20, start: int = FRESH_SEED_START, workers: int | None = 1) -> pd.DataFrame:
    """The default detector on `sets` fresh 5-seed sets per condition: one row per condition and set."""
    from scheduling.experiments import aggregate

    spec = f"{make_detector(DEFAULT_DETECTOR).label}+SRTF"
    rows = []
    for cond, (over, *_bars) in PAPER_BARS.items():
        for k in range(sets):
            seeds = list(range(start + 5 * k, start + 5 * k + 5))
            cfg = load_experiment("E2", {**over, "schedulers": [spec], "seeds": seeds})
            per_seed, jobs = run_units(units_for(cfg), workers=workers)
            a = aggregate(per_seed, jobs).iloc[0]
            rows.append({"condition": cond, "seeds": f"{seeds[0]}-{seeds[-1]}", "precision": a.precision,
                         "recall": a.recall, "fpr": a.fpr, "useful_recall": a.useful_recall,
                         "false_stop_rate": a.false_stop_rate})
    return pd.DataFrame(rows)


def render_fresh(table: pd.DataFrame) -> str:
    n = table.groupby("condition").size().iloc[0]
    out = [f"## The paper's bars on fresh seeds ({n} sets of 5 seeds from {FRESH_SEED_START})\n",
           f"The default detector ({make_detector(DEFAULT_DETECTOR).label}) on the E2 workload, on seeds no choice "
           "or threshold ever saw (it was chosen on seeds 1-100). A set passes when its mean precision and recall "
           "are at or above the bar and its FPR at or below it. Useful recall: hacking jobs stopped at or after "
           "their true peak and before their last checkpoint; false-stop rate: healthy RLHF jobs stopped.\n",
           "| Condition | Bar (P, R >=; FPR <=) | Sets passing | Worst precision | Worst recall | Worst FPR | "
           "Mean useful recall | Mean false-stop rate |", "|---|---|---|---|---|---|---|---|"]
    for cond, (_over, p, r, f) in PAPER_BARS.items():
        g = table[table.condition == cond]
        ok = ((g.precision >= p) & (g.recall >= r) & (g.fpr <= f)).sum()
        out.append(f"| {cond} | {p:.2f}, {r:.2f}; {f:.0%} | {ok}/{len(g)} | {_f(g.precision.min(), True)} | "
                   f"{_f(g.recall.min(), True)} | {_f(g.fpr.max(), True)} | {_f(g.useful_recall.mean(), True)} | "
                   f"{_f(g.false_stop_rate.mean(), True)} |")
    return "\n".join(out) + "\n"
