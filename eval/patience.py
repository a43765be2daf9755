"""Noise-scaled patience: the platform's default early-stop rule for real training curves.

A run is stopped when its eval has stayed well below its best for `patience` checkpoints in a row:

- every one of the last `patience` evals sits below the run's best by more than `z` noise SDs, the noise being
  the run's own, estimated online from its eval series (MAD of second differences / sqrt 6, floored by the
  gate's standard error where the trace reports one: `eval.detectors.RunNoise`);
- and by more than `drawdown` of the range the run has covered so far (a very smooth curve, whose noise
  estimate is near zero, is not stopped for a dip in its last digits);
- and, on a run that records the proxy reward, the proxy still rises over those checkpoints (least-squares
  slope > 0): the reward-hacking signature; a run whose proxy falls with its eval has collapsed, not hacked.

The rule judges a run only once it has `WARMUP` checkpoints (the own noise estimate needs 6 second
differences). A short run that reports its gate's SE, like the simulator's 7-checkpoint RLHF jobs, never gets
there: it is judged by the divergence slope test on the gate's SE (`eval.detectors.Divergence`'s gate phase,
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

from eval.detectors import MIN_DIFFS, Checkpoint, Detector, Divergence, Monitor, RunNoise, _slope

#: checkpoints a run needs before the patience rule judges it: enough for the own noise estimate
WARMUP = MIN_DIFFS + 2


class _NoisePatienceMonitor(Monitor):
    __slots__ = ("det", "gate", "noise", "rewards")

    def __init__(self, det: NoisePatience):
        self.det = det
        self.gate = det.gate.start()
        self.noise = RunNoise()
        self.rewards: list[float] = []

    def proxy_rises(self) -> bool:
        """The proxy's slope over the last `patience` checkpoints is positive; a run without a proxy passes,
        and so does a window with a missed proxy value (no evidence against the signature)."""
        if not any(r == r for r in self.rewards):
            return True
        window = self.rewards[-self.det.patience:]
        if any(r != r for r in window):
            return True
        return _slope(window) > 0.0

    def statistic(self) -> float:
        """The largest `z` at which this checkpoint stops the run (0 when none): the drop of the best of the last
        `patience` evals below the run's best, in units of the run's noise, once that drop is also more than
        `drawdown` of the range covered so far and the proxy (if any) still rises."""
        d = self.det
        evals = self.noise.evals
        if len(evals) < WARMUP or len(evals) <= d.patience:
            return 0.0
        sigma = self.noise.sigma()
        if not sigma > 0.0:
            return 0.0  # second differences all equal: a straight line, nothing to judge a drop against
        best, low = max(evals), min(evals)
        drop = best - max(evals[-d.patience:])
        if drop <= d.drawdown * (best - low) or not self.proxy_rises():
            return 0.0
        return drop / sigma

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
    """Stop when the last `patience` evals all sit more than `z` own-noise SDs and more than `drawdown` of the
    range below the run's best while the proxy (if recorded) still rises; runs shorter than WARMUP checkpoints
    with a gate SE are judged by the divergence slope test (`z_gate`, `short_ratio`, `window`) from `gate_from`
    of their planned steps on. See the module docstring."""

    name = "noisepatience"
    title = "NoisePatience"
    threshold = "z"

    def __init__(self, patience: int = 5, z: float = 2.0, drawdown: float = 0.5, z_gate: float = 0.475,
                 short_ratio: float = 2.75, window: int = 4, gate_from: float = 0.5):
        if patience < 1 or z < 0 or not 0 <= drawdown < 1 or not 0 <= gate_from <= 1:
            raise ValueError("noisepatience: need patience >= 1, z >= 0, 0 <= drawdown < 1, 0 <= gate_from <= 1")
        self.patience, self.z, self.drawdown = int(patience), float(z), float(drawdown)
        self.z_gate, self.short_ratio, self.window, self.gate_from = (float(z_gate), float(short_ratio), int(window),
                                                                      float(gate_from))
        # the gate phase only: every run leaves it (RunNoise's own estimate) at WARMUP checkpoints
        self.gate = Divergence(window=self.window, z=self.z_gate, short_ratio=self.short_ratio)

    def start(self) -> Monitor:
        return _NoisePatienceMonitor(self)

    def params(self) -> dict[str, Any]:
        return {"patience": self.patience, "z": self.z, "drawdown": self.drawdown, "z_gate": self.z_gate,
                "short_ratio": self.short_ratio, "window": self.window, "gate_from": self.gate_from}
