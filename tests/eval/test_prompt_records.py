"""Per-prompt gate records (eval/prompt_records.py) and `rlhfops detect TRACE --prompts PROMPTS.csv`: a clean file
in any row order becomes the matrix the test builds itself; a broken one (missing prompt, repeated (run, step,
prompt), non-numeric or non-finite score, missing column) is one line naming it, exit 2 from the CLI."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from common.errors import BadInput
from eval.prompt_records import load_prompt_records, paired_matrix

STEPS = [0, 10, 20, 30, 40, 50, 60, 70]
PROMPTS = [f"q{j:02d}" for j in range(24)]


def _scores(quality: list[float], seed: int) -> np.ndarray:
    """scores[step, prompt]: a fixed difficulty per prompt + the checkpoint's quality + small sampling noise."""
    rng = np.random.default_rng(seed)
    difficulty = rng.normal(size=len(PROMPTS))
    return difficulty[None, :] + np.asarray(quality)[:, None] + rng.normal(0, 0.05, (len(quality), len(PROMPTS)))


#: run id -> (quality per checkpoint, label): "fall" peaks at step 30 then falls far; "flat" stays put
RUNS = {"fall": ([0.0, 0.3, 0.6, 0.9, 0.3, -0.3, -0.9, -1.5], 1), "flat": ([0.5] * 8, 0)}


def write_files(d: Path, shuffle: bool = True) -> tuple[Path, Path, dict[str, np.ndarray]]:
    """A trace (means) and its prompts CSV (rows shuffled) for RUNS; returns the scores matrices too."""
    rows, trace, matrices = [], [], {}
    for i, (run, (quality, label)) in enumerate(RUNS.items()):
        y = _scores(quality, i)
        matrices[run] = y
        for t, step in enumerate(STEPS):
            trace.append({"run_id": run, "step": step, "eval_score": y[t].mean(), "label": label})
            rows += [{"run_id": run, "step": step, "prompt_id": p, "gold_score": y[t, j], "seed": 1000 + j}
                     for j, p in enumerate(PROMPTS)]
    records = pd.DataFrame(rows)
    if shuffle:
        records = records.sample(frac=1.0, random_state=0)
    pd.DataFrame(trace).to_csv(d / "trace.csv", index=False)
    records.to_csv(d / "prompts.csv", index=False)
    return d / "trace.csv", d / "prompts.csv", matrices


def test_any_row_order_gives_the_matrix(tmp_path):
    _, prompts, matrices = write_files(tmp_path)
    df = load_prompt_records(prompts)
    for run, y in matrices.items():
        steps, ids, scores = paired_matrix(df[df["run_id"] == run])
        assert steps.tolist() == STEPS and ids == PROMPTS
        np.testing.assert_allclose(scores, y, rtol=1e-12)


def _rewrite(path: Path, edit) -> None:
    df = pd.read_csv(path, dtype=str, keep_default_na=False)
    edit(df).to_csv(path, index=False)


def _at(df, run, step, prompt):
    return (df.run_id == run) & (df.step == step) & (df.prompt_id == prompt)


BROKEN = [
    ("missing prompt", lambda df: df.drop(df[_at(df, "flat", "20", "q07")].index),
     ["run 'flat' step 20 lacks prompt 'q07'"]),
    ("duplicate", lambda df: pd.concat([df, df[(df.run_id == "fall") & (df.step == "10") & (df.prompt_id == "q03")]]),
     ["run 'fall' step 10 repeats prompt 'q03'"]),
    ("non-numeric score", lambda df: df.assign(gold_score=np.where((df.run_id == "fall") & (df.step == "30")
                                                                   & (df.prompt_id == "q11"), "good", df.gold_score)),
     ["column 'gold_score'", "run 'fall', step 30", "prompt 'q11'", "'good' is not a number"]),
    ("infinite score", lambda df: df.assign(gold_score=np.where((df.run_id == "flat") & (df.step == "0")
                                                                & (df.prompt_id == "q00"), "inf", df.gold_score)),
     ["column 'gold_score'", "prompt 'q00'", "not a finite number"]),
    ("empty score", lambda df: df.assign(gold_score=np.where((df.run_id == "flat") & (df.step == "0")
                                                             & (df.prompt_id == "q01"), "", df.gold_score)),
     ["column 'gold_score'", "prompt 'q01'", "is empty"]),
    ("missing column", lambda df: df.drop(columns=["prompt_id"]), ["missing required column(s) prompt_id"]),
    ("non-numeric seed", lambda df: df.assign(seed=np.where(df.prompt_id == "q05", "x", df.seed)),
     ["column 'seed'", "'x' is not a number"]),
]


@pytest.mark.parametrize(("case", "edit", "names"), BROKEN, ids=[b[0] for b in BROKEN])
def test_broken_records_are_named(tmp_path, case, edit, names):
    _, prompts, _ = write_files(tmp_path)
    _rewrite(prompts, edit)
    with pytest.raises(BadInput) as err:
        load_prompt_records(prompts)
    msg = str(err.value)
    assert "\n" not in msg and str(prompts) in msg
    for name in names:
        assert name in msg


def test_partial_records_when_asked(tmp_path):
    _, prompts, matrices = write_files(tmp_path)
    _rewrite(prompts, BROKEN[0][1])
    df = load_prompt_records(prompts, complete=False)
    _, ids, scores = paired_matrix(df[df["run_id"] == "flat"])
    assert np.isnan(scores[2, ids.index("q07")]) and np.isfinite(np.delete(scores.ravel(), 2 * 24 + 7)).all()


# --------------------------------------------------------------------------- through the CLI


def run_cli(args: list, capsys, monkeypatch) -> tuple[int, str, str]:
    from rlhfops import cli

    monkeypatch.setattr(sys, "argv", ["rlhfops", *map(str, args)])
    try:
        cli.main()
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    out = capsys.readouterr()
    return code, out.out, out.err


def test_detect_prompts_stops_the_fall_and_keeps_its_peak(tmp_path, capsys, monkeypatch):
    trace, prompts, _ = write_files(tmp_path)
    out = tmp_path / "verdicts.csv"
    code, stdout, err = run_cli(["detect", trace, "--prompts", prompts, "--out", out], capsys, monkeypatch)
    assert code == 0, err
    v = pd.read_csv(out).set_index("run_id")
    assert "Paired" in stdout
    assert v.loc["flat", "stopped"] == 0
    # "fall" peaks at step 30 (index 3) and falls 0.6 a checkpoint with paired noise SD ~0.07 over 24 prompts:
    # certain at the first fall already
    assert v.loc["fall", "stopped"] == 1 and v.loc["fall", "best_step"] == 30 and v.loc["fall", "stop_step"] == 40
    assert v.loc["fall", "stop_phase"] == "after_peak" and v.loc["fall", "quality_kept"] > 0


def test_detect_prompts_lower_is_better_gives_the_same_verdicts(tmp_path, capsys, monkeypatch):
    trace, prompts, _ = write_files(tmp_path)
    code, _, err = run_cli(["detect", trace, "--prompts", prompts, "--out", tmp_path / "up.csv"], capsys, monkeypatch)
    assert code == 0, err
    t = pd.read_csv(trace)
    pd.DataFrame({**t, "eval_score": -t["eval_score"], "direction": "lower"}).to_csv(trace, index=False)
    _rewrite(prompts, lambda df: df.assign(gold_score=(-df.gold_score.astype(float)).astype(str)))
    code, _, err = run_cli(["detect", trace, "--prompts", prompts, "--out", tmp_path / "down.csv"], capsys, monkeypatch)
    assert code == 0, err
    up, down = pd.read_csv(tmp_path / "up.csv"), pd.read_csv(tmp_path / "down.csv")
    cols = ["run_id", "stopped", "stop_step", "best_step"]
    assert up[cols].equals(down[cols])
    assert up["stopped"].sum() == 1


@pytest.mark.parametrize(("case", "edit", "names"), BROKEN[:3], ids=[b[0] for b in BROKEN[:3]])
def test_detect_prompts_broken_records_exit_2_naming_it(tmp_path, capsys, monkeypatch, case, edit, names):
    trace, prompts, _ = write_files(tmp_path)
    _rewrite(prompts, edit)
    out = tmp_path / "verdicts.csv"
    code, _, err = run_cli(["detect", trace, "--prompts", prompts, "--out", out], capsys, monkeypatch)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 2 and len(lines) == 1, err
    for name in names:
        assert name in lines[0]
    assert not out.exists()


def test_detect_prompts_refuses_a_mismatch_with_the_trace(tmp_path, capsys, monkeypatch):
    trace, prompts, _ = write_files(tmp_path)
    _rewrite(prompts, lambda df: df[df.run_id != "flat"])
    code, _, err = run_cli(["detect", trace, "--prompts", prompts], capsys, monkeypatch)
    assert code == 2 and "no records for run 'flat'" in err
    code, _, err = run_cli(["detect", trace, "--prompts", prompts, "--detector", "noisepatience"], capsys, monkeypatch)
    assert code == 2 and "--prompts needs a detector that reads per-prompt scores" in err
    code, _, err = run_cli(["detect", trace, "--detector", "paired"], capsys, monkeypatch)
    assert code == 2 and "give --prompts" in err
