"""Issue 31 mutation kills for the PPO math (training/algorithms/core_algos.py), the streaming engine's small helpers
(training/rollout/engine.py), the run-noise estimate (eval/noise.py), Detector.scan's replay (eval/detector_base.py) and
the calibrated-parameter lookup (eval/detectors.py). Expected values are hand arithmetic (written next to each
assert) or a plain-Python re-derivation of the documented formula, never the code under test run twice."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import eval.noise as noise
from eval.detector_base import Checkpoint, Detector, Monitor
from eval.detectors import calibrated_params, make_detector
from eval.noise import RunNoise, _multiplicity, _normalised_change, _slope, _sxx, robust_diff_sigma
from training.algorithms import core_algos as P
from training.rollout.engine import IncrementalScorer, TransformersEngine, left_pad

MAD_TO_SD = 1.482602218505602
MEANABS_TO_SD = math.sqrt(math.pi / 2.0)


# ---------------------------------------------------------------- eval/noise.py

def test_robust_diff_sigma_mad_branch_by_hand():
    # 0, .25 alternating (8 evals): second differences -.5, .5, ... (6 of them), median 0, |dev| = .5 each,
    # MAD = .5 > 0 (and below 1): sd = 1.4826 * .5, sigma = sd / sqrt(6)
    evals = [0.0, 0.25] * 4
    assert robust_diff_sigma(evals) == pytest.approx(MAD_TO_SD * 0.5 / math.sqrt(6.0), rel=1e-12)


def test_robust_diff_sigma_zero_mad_falls_back_to_mean_abs_dev():
    # 0,1,0,1,0,1,0: second differences -2, 2, -2, 2, -2; median -2; |d2 - (-2)| = 0,4,0,4,0: MAD 0,
    # mean absolute deviation 8/5 = 1.6: sd = sqrt(pi/2) * 1.6, sigma = sd / sqrt(6)
    evals = [0.0, 1.0, 0.0, 1.0, 0.0, 1.0, 0.0]
    assert robust_diff_sigma(evals) == pytest.approx(MEANABS_TO_SD * 1.6 / math.sqrt(6.0), rel=1e-12)


def test_robust_diff_sigma_three_evals_is_a_number():
    # 3 evals are enough (one second difference: 0 - 2*1 + 3 = 1, its deviation from its own median is 0): 0.0
    assert robust_diff_sigma([0.0, 1.0, 3.0]) == 0.0
    assert math.isnan(robust_diff_sigma([0.0, 1.0]))


def _plain_sigma(v: list[float]) -> float:
    """The docstring's formula in plain Python doubles (the oracle for the float32 test)."""
    d2 = [v[i + 1] - 2.0 * v[i] + v[i - 1] for i in range(1, len(v) - 1)]

    def med(a):
        s = sorted(a)
        n = len(s)
        return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])

    m = med(d2)
    dev = [abs(x - m) for x in d2]
    mad = med(dev)
    sd = MAD_TO_SD * mad if mad > 0.0 else MEANABS_TO_SD * sum(dev) / len(dev)
    return sd / math.sqrt(6.0)


def test_robust_diff_sigma_computes_in_double_precision_for_float32_input():
    # a float32 series (e.g. read from a float32 array) is computed in float64, as the same values as Python floats
    arr = np.array([0.1, 0.7, 0.3, 0.9, 0.2, 0.8, 0.4, 0.65, 0.15], dtype=np.float32)
    want = _plain_sigma([float(x) for x in arr])
    assert robust_diff_sigma(arr) == pytest.approx(want, rel=1e-13, abs=0.0)
    assert robust_diff_sigma(list(arr)) == pytest.approx(want, rel=1e-13, abs=0.0)


def test_sxx_by_hand():
    # sum of (i - mean)^2 over 0..w-1 = w (w^2 - 1) / 12: w=4 -> 2.25+.25+.25+2.25 = 5; w=5 -> 4+1+0+1+4 = 10
    assert _sxx(4) == 5.0
    assert _sxx(5) == 10.0


def test_slope_is_exact_on_a_large_offset_line():
    # the centred least-squares slope is shift-invariant: 6e15 + i (integers, exact in a double) has slope 1 exactly
    # (the centred values v - mean are small exact integers), as has the same line without the offset
    y = [6e15 + i for i in range(5)]
    assert _slope(y) == 1.0
    assert _slope([float(i) for i in range(5)]) == 1.0


def test_multiplicity_by_hand(monkeypatch):
    assert _multiplicity(1) == 1.0
    assert _multiplicity(2) == pytest.approx(math.sqrt(1.0 + 2.0 * math.log(2.0)), rel=1e-12)  # 1.5485...
    assert _multiplicity(3) == pytest.approx(math.sqrt(1.0 + 2.0 * math.log(3.0)), rel=1e-12)
    monkeypatch.setattr(noise, "MULTIPLICITY", 0.5)  # documented knob: sqrt(1 + 2 * 0.5 * ln j)
    assert _multiplicity(2) == pytest.approx(math.sqrt(1.0 + math.log(2.0)), rel=1e-12)


def test_normalised_change_by_hand():
    # (1 - 0) / (0.5 * sqrt 2) = sqrt 2
    assert _normalised_change([0.0, 1.0], 0.5) == pytest.approx(math.sqrt(2.0), rel=1e-12)
    assert math.isnan(_normalised_change([0.0, 1.0], 0.0))  # no noise figure: not judged (no ZeroDivisionError)
    assert math.isnan(_normalised_change([1.0], 0.5))


def _cp(v: float, se: float = float("nan")) -> Checkpoint:
    return Checkpoint(step=0.0, eval_score=v, eval_se=se)


def test_run_noise_fresh_and_se_kept_only_when_positive():
    n = RunNoise()
    assert n.from_gate is False
    assert math.isnan(n.se)
    n.add(_cp(1.0, 0.0))  # an SE of 0 is no noise figure
    assert math.isnan(n.se)
    n.add(_cp(1.0, -0.1))
    assert math.isnan(n.se)
    n.add(_cp(1.0, 0.2))
    assert n.se == 0.2


def test_run_noise_short_run_leans_on_gate():
    n = RunNoise()
    for v in [0.0, 1.0] * 3 + [0.0]:  # 7 evals: 5 second differences < MIN_DIFFS = 6
        n.add(_cp(v))
    assert math.isnan(n.sigma())
    assert n.from_gate is False  # no gate SE: not from the gate
    g = RunNoise()
    for v in [0.0, 1.0] * 3 + [0.0]:
        g.add(_cp(v, 0.1))
    assert g.sigma() == 0.1
    assert g.from_gate is True


def test_run_noise_eight_evals_use_own_estimate():
    # 8 evals = 6 second differences = MIN_DIFFS: judged on its own estimate (0,.25 alternating: see the MAD test)
    own = MAD_TO_SD * 0.5 / math.sqrt(6.0)
    n = RunNoise()
    for v in [0.0, 0.25] * 4:
        n.add(_cp(v))
    assert n.sigma() == pytest.approx(own, rel=1e-12)
    assert n.from_gate is False
    g = RunNoise()
    for v in [0.0, 0.25] * 4:
        g.add(_cp(v, 0.01))  # gate SE below the own estimate: the own estimate
    assert g.sigma() == pytest.approx(own, rel=1e-12)
    assert g.from_gate is False
    big = RunNoise()
    for v in [0.0, 0.25] * 4:
        big.add(_cp(v, 10.0))  # gate SE above it: the floor is the gate's SE
    assert big.sigma() == 10.0
    assert big.from_gate is False


# ---------------------------------------------------------------- eval/detector_base.py: Detector.scan

class _ProbeMon(Monitor):
    __slots__ = ("seen",)

    def __init__(self, seen):
        self.seen = seen

    def observe(self, cp: Checkpoint) -> bool:
        self.seen.append(cp)
        return cp.loss > 2.0


class _Probe(Detector):
    name = "probe"

    def __init__(self):
        self.seen: list[Checkpoint] = []

    def start(self) -> Monitor:
        return _ProbeMon(self.seen)


def test_scan_replays_floats_with_step_and_nan_eval_defaults():
    det = _Probe()
    out = det.scan({"loss": np.array([[0, 1, 3, 5], [0, 0, 0, 0]], dtype=np.int64)})
    assert out.tolist() == [2, -1]
    assert out.dtype.kind == "i"  # indices, usable to index arrays
    seen = det.seen
    assert [cp.step for cp in seen] == [0.0, 1.0, 2.0, 0.0, 1.0, 2.0, 3.0]
    assert all(type(cp.step) is float and type(cp.loss) is float for cp in seen)
    assert all(type(cp.eval_score) is float and math.isnan(cp.eval_score) for cp in seen)


# ---------------------------------------------------------------- eval/detectors.py

def test_calibrated_params_and_make_detector_read_the_given_config(tmp_path):
    cfg = tmp_path / "det.yaml"
    cfg.write_text("detectors:\n  divergence:\n    params:\n      window: 5\n")
    assert calibrated_params("Divergence", cfg) == {"window": 5}
    assert calibrated_params("noisepatience", cfg) == {}
    assert calibrated_params("divergence", tmp_path / "missing.yaml") == {}
    assert make_detector("DIVERGENCE", cfg).window == 5  # shipped config says 4: the given file wins
    assert make_detector("divergence", cfg, window=6).window == 6


def test_calibrated_params_bad_config_names_the_detector_config(tmp_path):
    cfg = tmp_path / "det.yaml"
    cfg.write_text("- 1\n- 2\n")
    with pytest.raises(Exception, match=r"^detector config: .*must hold a mapping"):
        calibrated_params("divergence", cfg)


# ---------------------------------------------------------------- training/algorithms/core_algos.py

def test_effective_sample_size_by_hand():
    m = torch.ones(4, dtype=torch.bool)
    assert P.effective_sample_size(torch.ones(4), m) == pytest.approx(1.0)
    assert P.effective_sample_size(torch.tensor([1.0, 0.0, 0.0, 0.0]), m) == pytest.approx(0.25)
    # (1+2+3)^2 / (3 * (1+4+9)) = 36 / 42 = 6/7
    assert P.effective_sample_size(torch.tensor([1.0, 2.0, 3.0]), torch.ones(3)) == pytest.approx(6.0 / 7.0)
    assert P.effective_sample_size(torch.tensor([2.0]), torch.ones(1)) == pytest.approx(1.0)
    assert math.isnan(P.effective_sample_size(torch.tensor([1.0, 2.0]), torch.zeros(2)))
    assert math.isnan(P.effective_sample_size(torch.zeros(3), torch.ones(3)))


def test_group_advantages_unknown_kind_names_it():
    with pytest.raises(ValueError, match="unknown advantage kind 'ppo2'"):
        P.group_advantages(torch.zeros(4), 2, "ppo2")


def test_masked_mean_keeps_x_dtype():
    out = P.masked_mean(torch.tensor([1.0, 2.0, 3.0]), torch.tensor([1.0, 1.0, 0.0], dtype=torch.float64))
    assert out.dtype == torch.float32
    assert float(out) == 1.5


def test_masked_whiten_constant_is_zero_not_nan():
    # var 0: (x - mean) = 0 times rsqrt(1e-8) = 0
    out = P.masked_whiten(torch.full((3,), 3.0), torch.ones(3))
    assert out.tolist() == [0.0, 0.0, 0.0]


# ---------------------------------------------------------------- training/rollout/engine.py

def test_left_pad_width_is_the_longest_sequence():
    ids, mask = left_pad([[5]], 0)
    assert ids.tolist() == [[5]] and mask.tolist() == [[1]]
    ids, mask = left_pad([[7, 8], []], 0)
    assert ids.tolist() == [[7, 8], [0, 0]] and mask.tolist() == [[1, 1], [0, 0]]
    assert ids.dtype == torch.long


def test_engine_and_scorer_start_empty_and_release_to_none():
    eng = TransformersEngine(eos_id=1, pad_id=0)
    assert eng.model is None and eng.version == 0  # no weights synced yet: version 0
    eng.release()
    assert eng.cache is None
    sc = IncrementalScorer(torch.nn.Linear(1, 1), "logprob")
    assert sc.cache is None
    sc.cache = object()
    sc.release()
    assert sc.cache is None
    with pytest.raises(ValueError, match="unknown scorer kind 'logits'"):
        IncrementalScorer(torch.nn.Linear(1, 1), "logits")


# ---- the off-policy correction's edges (training.algorithms.core_algos; no selected test reaches these functions)
# -------------------
def test_decoupled_keeps_a_weight_exactly_at_the_cap_and_an_unknown_correction_names_the_choices():
    """"decoupled" keeps w where w <= cap: a token whose pi_prox equals pi_behav has w = 1 exactly, kept at cap 1
    (a strict `<` would zero it); a correction outside ("none", "tis", "decoupled") is refused with that list."""
    import torch

    from training.algorithms.core_algos import importance_weights

    zeros, mask = torch.zeros(1, 3), torch.tensor([[1.0, 1.0, 0.0]])
    w = importance_weights(zeros, zeros, mask, cap=1.0, correction="decoupled")
    assert w.tolist() == [[1.0, 1.0, 0.0]]
    with pytest.raises(ValueError) as err:
        importance_weights(zeros, zeros, mask, cap=1.0, correction="clip")
    assert str(err.value) == "unknown correction 'clip' (choose from: none, tis, decoupled)"


def test_the_off_policy_losss_approx_kl_is_the_k3_estimator_by_hand():
    """approx_kl = mean over trained tokens of (r - 1) - log r, r = pi / pi_prox: ratios 2 and 1 on two tokens give
    ((2 - 1) - ln 2 + 0) / 2 = 0.1534; the padded third token is not counted."""
    import math

    import torch

    from training.algorithms.core_algos import corrected_policy_loss

    prox = torch.zeros(1, 3)
    logprobs = torch.tensor([[math.log(2.0), 0.0, 5.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    _, stats = corrected_policy_loss(logprobs, prox, prox, torch.ones(1, 3), mask, clip=0.2, cap=2.0,
                                     correction="tis")
    assert float(stats["approx_kl"]) == pytest.approx((1 - math.log(2.0)) / 2, abs=1e-6)
