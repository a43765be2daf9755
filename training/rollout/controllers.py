"""OPPO's two online controllers and the deferral bookkeeping.

- `DeltaController`: the overcommitment Delta of inter-step overlap. Every W steps, once 2W step rewards
  are in, compare the mean reward of the last window with the window before (Algorithm 1, lines 21-26)
  and move Delta by max(1, floor(Delta/4)) within [Delta_min, Delta_max].
  Direction: the paper disagrees with itself. Eq. 4 raises Delta while reward improves (s_t > 0) and
  lowers it otherwise, so Delta decays as training converges (the text's stated intent); Algorithm 1
  line 24 as printed does the opposite (Delta - sign(d) * change). `rule="eq4"` (default) follows
  Eq. 4's direction; `rule="alg1"` follows line 24 literally.
- `ChunkTuner`: intra-step chunk size C. Every `every` steps it tries each candidate for one step,
  measures rollout+score seconds per generated token, and keeps the fastest (paper Sec. 3.1).
- `deferral_histogram`: how many steps each trained request waited in the buffer (paper Table 2).
"""

from __future__ import annotations

import math
from collections import Counter


class DeltaController:
    def __init__(self, delta_init: int, delta_min: int, delta_max: int, window: int, rule: str = "eq4",
                 adaptive: bool = True):
        self.delta, self.delta_min, self.delta_max = delta_init, delta_min, delta_max
        self.window, self.rule, self.adaptive = window, rule, adaptive
        self.rewards: list[float] = []

    def update(self, reward_mean: float) -> int:
        """Record one step's mean reward; returns Delta for the next step."""
        if not self.adaptive or math.isnan(reward_mean):
            return self.delta
        self.rewards.append(reward_mean)
        w = self.window
        if len(self.rewards) >= 2 * w:
            recent = sum(self.rewards[-w:]) / w
            before = sum(self.rewards[-2 * w : -w]) / w
            d = recent - before
            if self.rule == "eq4":
                sign = 1 if d > 0 else -1  # Eq. 4: s_t <= 0 lowers Delta
            else:
                sign = -((d > 0) - (d < 0))  # Algorithm 1 line 24 as printed
            change = max(1, self.delta // 4)
            self.delta = int(min(self.delta_max, max(self.delta_min, self.delta + sign * change)))
            self.rewards = self.rewards[-w:]
        return self.delta

    def state_dict(self) -> dict:
        return {"delta": self.delta, "rewards": list(self.rewards)}

    def load_state_dict(self, state: dict) -> None:
        self.delta, self.rewards = int(state["delta"]), list(state["rewards"])


class ChunkTuner:
    def __init__(self, initial: int, candidates: list[int], every: int, enabled: bool = True):
        self.current, self.candidates, self.every, self.enabled = initial, list(candidates), every, enabled
        self.trial: list[int] = []
        self.measured: dict[int, float] = {}

    def chunk_for_step(self, step: int) -> int:
        if self.enabled and step % self.every == 0 and not self.trial and not self.measured:
            self.trial = list(self.candidates)
        return self.trial[0] if self.trial else self.current

    def report(self, chunk: int, seconds: float, tokens: int) -> None:
        if not self.trial or chunk != self.trial[0]:
            return
        self.measured[chunk] = seconds / max(tokens, 1)
        self.trial.pop(0)
        if not self.trial:
            self.current = min(self.measured, key=self.measured.get)
            self.measured = {}

    def state_dict(self) -> dict:
        return {"current": self.current, "trial": list(self.trial), "measured": dict(self.measured)}

    def load_state_dict(self, state: dict) -> None:
        self.current, self.trial = int(state["current"]), list(state["trial"])
        self.measured = {int(k): float(v) for k, v in state["measured"].items()}


def deferral_histogram(counts: Counter, max_bucket: int = 3) -> dict[str, float]:
    """Share of trained requests deferred 0, 1, 2, >=3 steps, plus the mean (the paper's Table 2)."""
    total = sum(counts.values())
    out: dict[str, float] = {}
    for k in range(max_bucket):
        out[str(k)] = counts.get(k, 0) / total if total else 0.0
    out[f"{max_bucket}+"] = sum(v for k, v in counts.items() if k >= max_bucket) / total if total else 0.0
    out["mean"] = sum(k * v for k, v in counts.items()) / total if total else 0.0
    out["n"] = float(total)
    return out
