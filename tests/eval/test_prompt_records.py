"""Per-prompt gate records (eval/prompt_records.py) and `rlhfops detect TRACE --prompts PROMPTS.csv`: a clean file
in any row order becomes the matrix the test builds itself; a broken one (missing prompt, repeated (run, step,
prompt), non-numeric or non-finite score, missing column) is one line naming it, exit 2 from the CLI."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from cli_helpers import run_cli_output as run_cli

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


# --------------------------------------------------------------------------- extension batches


def gate_like(d: Path, extra: int = 216, seed: int = 4) -> tuple[Path, Path]:
    """One run as `training/gate.py` records it: 24 gate prompts (ids 0-23, one seed for the batch) at 4 checkpoints,
    and, where the last checkpoint's comparison with the best was close, an extension batch (ids 24.., its own
    seed) scored for the checkpoints the rule named: the first, the best and the last (the default relative margin
    0.125 judges the contrast last - 0.875 best - 0.125 first). The last checkpoint is 0.1 below the best, 0.0625
    beyond the relative margin: about 2.3 SEs of the contrast's mean on 24 prompts (undecided), about 7 on 240."""
    rng = np.random.default_rng(seed)
    n = 24 + extra
    difficulty = rng.normal(size=n)
    quality = {0: 0.0, 10: 0.3, 20: 0.29, 30: 0.2}
    rows, trace = [], []
    for step, q in quality.items():
        y = difficulty + q + rng.normal(0, 0.1, n)
        ids = range(24) if step == 20 or extra == 0 else range(n)  # steps 0 (first), 10 (best), 30 were extended
        rows += [{"run_id": "r", "step": step, "prompt_id": str(j), "gold_score": y[j],
                  "seed": 7000 if j < 24 else 7001} for j in ids]
        trace.append({"run_id": "r", "step": step, "eval_score": y[:24].mean()})
    pd.DataFrame(trace).to_csv(d / "trace.csv", index=False)
    pd.DataFrame(rows).sample(frac=1.0, random_state=1).to_csv(d / "prompts.csv", index=False)
    return d / "trace.csv", d / "prompts.csv"


def test_extension_batches_are_read_and_decide_a_close_call(tmp_path, capsys, monkeypatch):
    verdicts = {}
    for extra in (0, 216):
        d = tmp_path / str(extra)
        d.mkdir()
        trace, prompts = gate_like(d, extra)
        df = load_prompt_records(prompts)
        steps, ids, scores = paired_matrix(df)
        assert ids[:3] == ["0", "1", "2"] and len(ids) == 24 + extra  # the pool's order, not text order
        assert np.isnan(scores[2, 24:]).all() and np.isfinite(scores[[0, 1, 3]]).all()
        code, _, err = run_cli(["detect", trace, "--prompts", prompts, "--out", d / "v.csv"], capsys, monkeypatch)
        assert code == 0, err
        verdicts[extra] = pd.read_csv(d / "v.csv").iloc[0]
    assert verdicts[0]["stopped"] == 0  # 24 prompts cannot tell 0.0625 from noise
    assert verdicts[216]["stopped"] == 1 and verdicts[216]["stop_step"] == 30 and verdicts[216]["best_step"] == 10


def test_a_broken_extension_batch_is_named(tmp_path):
    _, prompts = gate_like(tmp_path)
    _rewrite(prompts, lambda df: df.drop(df[_at(df, "r", "30", "100")].index))
    with pytest.raises(BadInput, match="run 'r' step 30 lacks prompt '100' "):
        load_prompt_records(prompts)
    _, prompts = gate_like(tmp_path)
    _rewrite(prompts, lambda df: df.drop(df[_at(df, "r", "20", "5")].index))  # a gate prompt
    with pytest.raises(BadInput, match="run 'r' step 20 lacks prompt '5' "):
        load_prompt_records(prompts)
    _, prompts = gate_like(tmp_path)
    # step 0 scored on the extension batch only: the gate's batch is missing there, the extension's at step 20
    _rewrite(prompts, lambda df: pd.concat([df[df.step != "0"], df[(df.step == "10") & (df.seed == "7001")]
                                            .assign(step="0")]))
    with pytest.raises(BadInput, match="run 'r' step 20 lacks prompt '24'.*no batch of prompts is scored at every"):
        load_prompt_records(prompts)


def test_an_explicit_batch_column(tmp_path):
    _, prompts = gate_like(tmp_path)
    _rewrite(prompts, lambda df: df.assign(batch=np.where(df.seed == "7000", "0", "1"), seed="5"))
    assert len(load_prompt_records(prompts)) == 4 * 24 + 3 * 216  # steps 0, 10 and 30 extended
    _rewrite(prompts, lambda df: df.assign(batch="0"))  # all one batch: the extension prompts are then missing
    with pytest.raises(BadInput, match="step 20 lacks prompt '24'"):
        load_prompt_records(prompts)
