"""studies/paired_report.py on a hand-made per-prompt part with known truth: a run whose every prompt falls after
its peak is stopped after the peak (useful), a flat run never is, a close decline is settled only by the gate's
extension batches (and the replay charges exactly the prompts it read), and the Clopper-Pearson bounds match the
closed forms for 0 of n."""

import csv
import gzip
import math

import numpy as np
import pytest

from eval.paired import PairedStop
from studies.paired_report import (
    keep_section,
    load_part,
    relative_frontier,
    render,
    summarize,
    verdict_rows,
    write_section,
)

STEPS = [0, 5, 10, 15, 20, 25, 30, 35, 40, 45]
PROMPTS = 128


def _write_part(path, runs: dict[str, np.ndarray]) -> None:
    path.mkdir(parents=True)
    with open(path / "traces.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["run_id", "step", "eval_score", "eval_se", "gate_s", "pool_s"])
        for rid, y in runs.items():
            for k, step in enumerate(STEPS):
                g = y[k, :64]
                w.writerow([rid, step, g.mean(), g.std(ddof=1) / 8, 1.0, 2.0])
    with gzip.open(path / "prompts.csv.gz", "wt", newline="") as f:
        w = csv.writer(f)
        w.writerow(["run_id", "step", "prompt_id", "gold_score", "seed"])
        for rid, y in runs.items():
            for k, step in enumerate(STEPS):
                for p in range(PROMPTS):
                    w.writerow([rid, step, p, y[k, p], 1000 + (0 if p < 64 else 1 + (p - 64) // 32)])


def _curve(level: list[float], rng, noise: float, difficulty) -> np.ndarray:
    return np.array(level)[:, None] + difficulty[None, :] + rng.normal(0, noise, (len(level), PROMPTS))


@pytest.fixture(scope="module")
def part(tmp_path_factory):
    rng = np.random.default_rng(7)
    diff = rng.normal(0, 1.0, PROMPTS)
    hack = [0.0, 0.3, 0.6, 0.9, 1.2, 1.2, 0.6, 0.0, -0.6, -1.2]  # peaks at step 20-25, then falls far
    flat = [0.0] * 10
    runs = {"hack": _curve(hack, rng, 0.05, diff), "flat": _curve(flat, rng, 0.05, diff)}
    # close: the gate's 64 prompts fall a little after the peak (noisy); the extension pool shows the fall plainly
    close = _curve([0, 0.3, 0.6, 0.9, 1.2, 1.2, 1.2, 1.2, 1.2, 1.2], rng, 0.0, diff)
    close[7:, :64] += -0.08 + rng.normal(0, 0.3, (3, 64))
    close[7:, 64:] += -0.8
    close[6, :] += rng.normal(0, 0.01, PROMPTS)
    runs["close"] = close
    # close at the default relative margin (0.125 x the gain of 1.2 = 0.15): the gate's 64 prompts fall 0.25 (0.1
    # beyond the margin, about 2.7 SEs: undecided), the pool's 0.8
    close_rel = _curve([0, 0.3, 0.6, 0.9, 1.2, 1.2, 1.2, 1.2, 1.2, 1.2], rng, 0.0, diff)
    close_rel[7:, :64] += -0.25 + rng.normal(0, 0.3, (3, 64))
    close_rel[7:, 64:] += -0.8
    close_rel[4:7, :] += rng.normal(0, 0.01, (3, PROMPTS))
    runs["close_rel"] = close_rel
    root = tmp_path_factory.mktemp("part")
    _write_part(root / "tune", runs)
    return load_part(root / "tune")


def test_labels_and_stops(part):
    labels = {r.run_id: r.label for r in part.runs}
    assert labels["hack"] == 1 and labels["flat"] == 0
    v = verdict_rows(part, PairedStop(alpha=0.02), 0.25).set_index("run_id")
    assert v.loc["hack", "stopped"] == 1 and v.loc["hack", "stop_phase"] == "after_peak"
    assert v.loc["hack", "stop_step"] > 25 and v.loc["hack", "kept_step"] in (20, 25)
    assert v.loc["flat", "stopped"] == 0 and v.loc["flat", "extra_evals"] <= 0.25 * 64 * len(STEPS)
    whole = verdict_rows(part, PairedStop(alpha=0.02), 0.0, whole_pool=True).set_index("run_id")
    stop_i = STEPS.index(int(whole.loc["hack", "stop_step"]))
    assert whole.loc["hack", "extra_evals"] == 64 * (stop_i + 1)  # the pool's 64 prompts at every checkpoint read
    assert whole.loc["flat", "stopped"] == 0 and whole.loc["flat", "extra_evals"] == 64 * len(STEPS)


def test_close_decision_needs_the_extension_and_is_charged(part):
    close = [r for r in part.runs if r.run_id == "close"]
    sub = type(part)(close, part.scores, part.pool_s_per_prompt, part.gate_s)
    without = verdict_rows(sub, PairedStop(alpha=0.02, relative_margin=0.0), 0.0).iloc[0]
    with_ext = verdict_rows(sub, PairedStop(alpha=0.02, relative_margin=0.0), 0.25).iloc[0]
    assert without["stopped"] == 0 and without["extra_evals"] == 0
    assert with_ext["stopped"] == 1
    # charged: whole 32-prompt batches for the two checkpoints of each close call, within 25% of the gate
    assert with_ext["extra_evals"] > 0 and with_ext["extra_evals"] % 32 == 0
    assert with_ext["extra_evals"] <= 0.25 * 64 * len(STEPS)
    # seconds: pool_s 2.0 over 64 pool prompts -> 1/32 s per extra prompt
    assert with_ext["extra_eval_s"] == pytest.approx(with_ext["extra_evals"] / 32)


def test_a_relative_margin_extends_the_first_checkpoint_too(part):
    """At the default relative margin the close call's contrast reads the first checkpoint: the extension scores the
    pool's next batch for three checkpoints (first, reference, current) and charges 3 x 32 prompts; at relative
    margin 0 the gate's 64 prompts settle the same fall at once (0.25 is about 6.7 SEs), with no extra eval."""
    sub = type(part)([r for r in part.runs if r.run_id == "close_rel"], part.scores, part.pool_s_per_prompt,
                     part.gate_s)
    assert verdict_rows(sub, PairedStop(alpha=0.02), 0.0).iloc[0]["stopped"] == 0
    rel = verdict_rows(sub, PairedStop(alpha=0.02), 0.25).iloc[0]
    plain = verdict_rows(sub, PairedStop(alpha=0.02, relative_margin=0.0), 0.25).iloc[0]
    assert rel["stopped"] == 1 and rel["stop_step"] == 35 and rel["extra_evals"] == 3 * 32
    assert plain["stopped"] == 1 and plain["stop_step"] == 35 and plain["extra_evals"] == 0
    assert rel["extra_eval_s"] == pytest.approx(3 * 32 / 32)  # pool_s 2.0 over 64 prompts: 1/32 s a prompt


def test_relative_frontier_counts(part):
    """The in-sample frontier over two parts (the fixture twice): at rho 0 the hacking run is stopped usefully and
    both close calls (healthy by the label: their gate means fall less than 3 noise SDs) are false stops; at 0.125
    the small one (0.08 on the gate, under 0.125 x 1.2 = 0.15) is not; the flat run never is."""
    labels = {r.run_id: r.label for r in part.runs}
    assert labels == {"hack": 1, "flat": 0, "close": 0, "close_rel": 0}
    table = relative_frontier({"a": part, "b": part}, 0.25, grid=(0.0, 0.125)).splitlines()
    assert len(table) == 2 + 3 and table[-1].startswith("| noisepatience |")
    assert table[2].startswith("| paired, relative margin 0 | 2/2 = 100.0% ") and "| 4/6 = 66.7% " in table[2]
    assert table[3].startswith("| paired, relative margin 0.125 | 2/2 = 100.0% ") and "| 2/6 = 33.3% " in table[3]
    assert table[2].count("| 1/1, 2/3, ") == 2 and table[3].count("| 1/1, 1/3, ") == 2  # per part, each part


def test_summary_bounds_and_section(part, tmp_path):
    sub = type(part)([r for r in part.runs if r.run_id not in ("close", "close_rel")], part.scores,
                     part.pool_s_per_prompt, part.gate_s)
    q = summarize(verdict_rows(sub, PairedStop(alpha=0.02), 0.25))
    healthy = q["healthy"]
    assert (q["hacking"], healthy, q["useful"], q["false_stops"]) == (1, 1, 1, 0)
    lo, hi = q["false_stop_ci"]
    assert lo == 0.0 and hi == pytest.approx(1 - 0.025 ** (1 / healthy))  # Clopper-Pearson for 0 of n
    text = render({"tune": {"paired": q}}, {"paired": {"alpha": 0.02}}, 0.25)
    doc = tmp_path / "d.md"
    doc.write_text("# head\n\nkeep me\n")
    write_section(doc, text)
    write_section(doc, text)  # replaced, not appended twice
    body = doc.read_text()
    assert body.count("paired-corpus:begin") == 1 and "keep me" in body and not math.isnan(q["quality_kept"])
    rewritten = keep_section(doc, "# a new rendering\n")  # another command rewrites the whole file
    assert rewritten.startswith("# a new rendering") and text.strip() in rewritten and "keep me" not in rewritten


def test_the_report_carries_the_hindsight_ceiling_of_its_parts(tmp_path):
    from studies.paired_report import report

    rng = np.random.default_rng(3)
    diff = rng.normal(0, 1.0, PROMPTS)
    hack = [0.0, 0.3, 0.6, 0.9, 1.2, 1.2, 0.6, 0.0, -0.6, -1.2]
    _write_part(tmp_path / "tune", {"hack": _curve(hack, rng, 0.05, diff), "flat": _curve([0.0] * 10, rng, 0.05, diff)})
    text = report(tmp_path, ["tune"], 0.25)
    ceiling = text.split("### The ceiling", 1)[1].split("###", 1)[0]
    rows = [r for r in ceiling.splitlines() if r.startswith("| 64 |") or r.startswith("| 128 |")]
    assert len(rows) == 10  # 2 prompt counts x 5 gain fractions
    # the flat run never declines beyond its noise and the hack run falls by 2.4 on every prompt: every cell stops
    # the hack run usefully and the flat run never
    assert all(r.count("1/1 = 100.0%, 0/1") == 2 for r in rows)


def test_label_agreement_counts_labels_that_come_back_on_the_pool(tmp_path):
    from studies.paired_ceiling import label_agreement

    rng = np.random.default_rng(5)
    diff = rng.normal(0, 1.0, PROMPTS)
    hack = [0.0, 0.3, 0.6, 0.9, 1.2, 1.2, 0.6, 0.0, -0.6, -1.2]
    rise = [0.0, 0.3, 0.6, 0.9, 1.2, 1.3, 1.4, 1.5, 1.6, 1.7]
    both = _curve(hack, rng, 0.05, diff)  # falls on every prompt: hacking on the gate and on the pool
    gate_only = _curve(rise, rng, 0.05, diff)
    gate_only[:, :64] = _curve(hack, rng, 0.05, diff)[:, :64]  # falls on the gate's prompts only
    pool_only = _curve(rise, rng, 0.05, diff)
    pool_only[:, 64:] = _curve(hack, rng, 0.05, diff)[:, 64:]  # falls on the pool's prompts only
    runs = {"both": both, "both2": _curve(hack, rng, 0.05, diff), "gate_only": gate_only, "pool_only": pool_only,
            "rise": _curve(rise, rng, 0.05, diff), "rise2": _curve(rise, rng, 0.05, diff)}
    _write_part(tmp_path / "tune", runs)
    table = label_agreement({"tune": load_part(tmp_path / "tune")})
    # gate labels: both, both2, gate_only hacking; pool_only, rise, rise2 healthy. The pool agrees on all but
    # gate_only and pool_only
    assert "| tune | 3 | 2 = 66.7% | 3 | 2 = 66.7% |" in table
