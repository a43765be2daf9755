"""Noise-scaled patience: the platform's default early-stop rule for real training curves.

A run is stopped when its eval has stayed well below its best for `patience` checkpoints in a row, or, on a run
that records the proxy reward, when its last `fast_window` evals have fallen much further (`fast_ratio` times the
bar) while the proxy still rises:

- every one of the last `patience` evals sits below the run's best by more than `z` noise SDs, the noise being
  the run's own, estimated online from its eval series (MAD of second differences / sqrt 6, floored by the
  gate's standard error where the trace reports one: `eval.noise.RunNoise`);
- and by more than `drawdown` of the range the run has covered so far (a very smooth curve, whose noise
  estimate is near zero, is not stopped for a dip in its last digits);
- and, on a run that records the proxy reward, the proxy still rises over the last `patience` checkpoints
  (least-squares slope > 0): the reward-hacking signature; a run whose proxy falls with its eval has collapsed,
  not hacked.

With `mean_window` w > 0 the patience path judges means instead of every eval: the mean of the last w evals must
sit below the best mean of w consecutive earlier evals (windows that end before the last w begin) by more than `z`
SDs of a difference of two such means (sigma * sqrt(2 / w)), and by more than `drawdown` of the range. Every eval
of a window below the bar is a much weaker test than their mean below it: on a gate whose SE is a sizeable part of
the run's range (a 64-prompt gate), one lucky eval in the window holds the min rule off for `patience` more
checkpoints, while the mean averages it out. The proxy must still rise over the last `patience` checkpoints.

The deep-drop path exists because a hacked policy's held-out score often collapses within a checkpoint or two
late in a run (the proxy bonus takes over), and waiting `patience` checkpoints for it lets the run end first.
It needs the full signature (a proxy that rises while the eval collapses) because a supervised validation curve
has no proxy to confirm a single bad eval with; such runs are judged by the patience rule alone.

The rule judges a run only once it has `WARMUP` checkpoints (the own noise estimate needs 6 second
differences). A short run that reports its gate's SE, like the simulator's 7-checkpoint RLHF jobs, never gets
there: it is judged by the divergence slope test on the gate's SE (`eval.stop_rules.Divergence`'s gate phase,
bars `z_gate` and `short_ratio`, chosen on the simulator), and only once the trainer reports at least
`gate_from` of its planned steps done (`Checkpoint.progress`; NaN: unknown, no such stop). Real PPO runs dip
by several gate SEs early and recover (the corpus's own-PPO runs did), so a slope test that early stops
healthy runs; the simulator's hacking jobs peak at 55-75% of their run, so from half-way on it loses nothing.

Every threshold is relative to the run's own noise or range: `a * eval + b` (a > 0; the gate's SE scales with
it) gives the same verdicts. A lower-is-better metric is declared (trace column `direction`, or
`rlhfops detect --direction lower`) and flipped before a detector sees it, never guessed.

`z` is the threshold `rlhfops detect --calibrate` fits to a target false-stop rate on healthy runs.
"""

from __future__ import annotations

from typing import Any

from eval.detector_base import Checkpoint, Detector, Monitor
from eval.noise import MIN_DIFFS, RunNoise, _slope
from eval.stop_rules import Divergence

#: checkpoints a run needs before the patience rule judges it: enough for the own noise estimate
WARMUP = MIN_DIFFS + 2


class _NoisePatienceMonitor(Monitor):
    __slots__ = ("det", "gate", "noise", "rewards")

    def __init__(self, det: NoisePatience):
        self.det = det
        self.gate = det.gate.start()
        self.noise = RunNoise()
        self.rewards: list[float] = []

    def has_proxy(self) -> bool:
        return any(r == r for r in self.rewards)

    def proxy_rises(self) -> bool:
        """The proxy's slope over the last `patience` checkpoints is positive; a run without a proxy passes,
        and so does a window with a missed proxy value (no evidence against the signature)."""
        if not self.has_proxy():
            return True
        window = self.rewards[-self.det.patience:]
        if any(r != r for r in window):
            return True
        return _slope(window) > 0.0

    def window_statistic(self, w: int, sigma: float, best: float, low: float) -> float:
        """The drop of the best of the last `w` evals below the run's best, in noise SDs, once that drop is also
        more than `drawdown` of the range covered so far (0 otherwise)."""
        drop = best - max(self.noise.evals[-w:])
        return drop / sigma if drop > self.det.drawdown * (best - low) else 0.0

    def mean_statistic(self, w: int, sigma: float, best: float, low: float) -> float:
        """The drop of the mean of the last `w` evals below the best mean of `w` consecutive evals that end before
        them, in SDs of a difference of two such means, once that drop is also more than `drawdown` of the range
        covered so far (0 otherwise, and 0 before there is an earlier full window)."""
        evals = self.noise.evals
        n = len(evals)
        if n < 2 * w:
            return 0.0
        current = sum(evals[-w:]) / w
        window_sum = sum(evals[:w])
        top = window_sum
        for i in range(w, n - w):
            window_sum += evals[i] - evals[i - w]
            top = max(top, window_sum)
        drop = top / w - current
        return drop / (sigma * (2.0 / w) ** 0.5) if drop > self.det.drawdown * (best - low) else 0.0

    def statistic(self) -> float:
        """The largest `z` at which this checkpoint stops the run (0 when none): over the `patience` window, the
        window statistic itself; over the `fast_window` (if any), the window statistic / `fast_ratio` (a deeper
        drop over fewer checkpoints); either only while the proxy (if any) still rises over `patience` checkpoints."""
        d = self.det
        evals = self.noise.evals
        if len(evals) < WARMUP or len(evals) <= max(d.patience, d.mean_window):
            return 0.0
        sigma = self.noise.sigma()
        if not sigma > 0.0:
            return 0.0  # second differences all equal: a straight line, nothing to judge a drop against
        if not self.proxy_rises():
            return 0.0
        best, low = max(evals), min(evals)
        stat = (self.mean_statistic(d.mean_window, sigma, best, low) if d.mean_window
                else self.window_statistic(d.patience, sigma, best, low))
        if d.fast_window and self.has_proxy():
            stat = max(stat, self.window_statistic(d.fast_window, sigma, best, low) / d.fast_ratio)
        return stat

    def observe(self, cp: Checkpoint) -> bool:
        if cp.eval_score != cp.eval_score:  # a missed eval is no evidence either way
            return False
        self.noise.add(cp)
        self.rewards.append(cp.reward)
        if len(self.noise.evals) < WARMUP:
            # a short run, judged on its gate's SE (no SE: not judged yet), late in its planned run only
            return self.gate.observe(cp) and cp.progress >= self.det.gate_from
        return self.statistic() > self.det.z


class NoisePatience(Detector):
    """Stop when the last `patience` evals all (`mean_window` w > 0: the mean of the last w evals) sit more than
    `z` own-noise SDs and more than `drawdown` of the range below the run's best (the best earlier mean of w) while
    the proxy (if recorded) still rises, or (runs with a proxy) the last `fast_window` evals by more than
    `fast_ratio * z` SDs (`fast_window` 0: no such path); runs shorter than WARMUP checkpoints with a gate SE are
    judged by the divergence slope test (`z_gate`, `short_ratio`, `window`) from `gate_from` of their planned steps
    on. See the module docstring."""

    name = "noisepatience"
    title = "NoisePatience"
    threshold = "z"

    def __init__(self, patience: int = 5, z: float = 2.0, drawdown: float = 0.5, z_gate: float = 0.475,
                 short_ratio: float = 2.75, window: int = 4, gate_from: float = 0.5, fast_window: int = 1,
                 fast_ratio: float = 2.5, mean_window: int = 0):
        if patience < 1 or z < 0 or not 0 <= drawdown < 1 or not 0 <= gate_from <= 1:
            raise ValueError("noisepatience: need patience >= 1, z >= 0, 0 <= drawdown < 1, 0 <= gate_from <= 1")
        if not 0 <= fast_window < patience or not fast_ratio >= 1:
            raise ValueError("noisepatience: need 0 <= fast_window < patience (0: off) and fast_ratio >= 1")
        if not mean_window >= 0:
            raise ValueError("noisepatience: need mean_window >= 0 (0: every eval of the patience window judged)")
        self.patience, self.z, self.drawdown = int(patience), float(z), float(drawdown)
        self.fast_window, self.fast_ratio, self.mean_window = int(fast_window), float(fast_ratio), int(mean_window)
        self.z_gate, self.short_ratio, self.window, self.gate_from = (float(z_gate), float(short_ratio), int(window),
                                                                      float(gate_from))
        # the gate phase only: every run leaves it (RunNoise's own estimate) at WARMUP checkpoints
        self.gate = Divergence(window=self.window, z=self.z_gate, short_ratio=self.short_ratio)

    def start(self) -> Monitor:
        return _NoisePatienceMonitor(self)

    def params(self) -> dict[str, Any]:
        return {"patience": self.patience, "z": self.z, "drawdown": self.drawdown, "z_gate": self.z_gate,
                "short_ratio": self.short_ratio, "window": self.window, "gate_from": self.gate_from,
                "fast_window": self.fast_window, "fast_ratio": self.fast_ratio, "mean_window": self.mean_window}
