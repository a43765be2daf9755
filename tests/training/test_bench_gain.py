"""`rlhfops bench gain` (training/benches/gain.py): the paired gain and its standard error by hand; the command on a
tenant's tiny job writes every figure, scores every held-out prompt, and exits 1 when a seed's gain is not above
`--z` standard errors."""

from __future__ import annotations

import json
import math

import pytest
from cli_helpers import run_cli_output
from tenant_job import write_job

from training.benches.gain import paired_gain


def test_the_paired_gain_and_its_standard_error_by_hand():
    # differences 1, 0, -1, 1: mean 0.25; deviations 0.75, -0.25, -1.25, 0.75 -> sum of squares 2.75, / 3, sqrt, / 2
    gain, se = paired_gain([0, 1, 1, 0], [1, 1, 0, 1])
    assert gain == pytest.approx(0.25) and se == pytest.approx(math.sqrt(2.75 / 3) / 2)
    assert paired_gain([1, 0], [1, 0]) == (0.0, 0.0)


@pytest.mark.timeout(600)
def test_bench_gain_on_a_tenant_job_writes_every_figure(tmp_path, capsys, monkeypatch):
    config = write_job(tmp_path / "tenant", "my_reward.py:score")
    out = tmp_path / "gain.json"
    # --z 10: a gain of 10 standard errors in 2 steps does not happen, so the command says so with exit 1
    code, stdout, err = run_cli_output(["bench", "gain", "--config", config, "--seeds", "1", "--steps", "2",
                                        "--overlap", "none", "--z", "10", "--set", "eval_prompts=2", "--out", out],
                                       capsys, monkeypatch)
    assert code == 1, err
    result = json.loads(out.read_text())
    (seed,) = result["seeds"]
    assert result["overrides"] == {"eval_prompts": 2} and result["passed"] is False
    assert seed["heldout_prompts"] == 4 and seed["steps"] == 2  # every held-out row, not the gate's 2
    assert seed["gain"] == pytest.approx(seed["final"] - seed["start"])  # paired on the same prompts
    assert {0.0, 0.25, 0.5, 0.75, 1.0} >= {seed["start"], seed["final"]}
    assert "NOT above 10.0 SE" in " ".join(stdout.split())
