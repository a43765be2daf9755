"""`rlhfops bench gain`: does RL improve the held-out gate score over the policy it starts from?

For each seed: the job's warm start (the base policy: its SFT, or its checkpoint) is scored on every held-out prompt
by the job's gate; the job trains its steps; the trained policy is scored on the same prompts with the same sampling
seed (common random numbers, training/gate.py). The gain is the mean of the per-prompt differences (trained - start)
and its standard error the differences' sample standard deviation over sqrt(n): the paired comparison cancels how
hard each prompt is. A seed passes when its gain exceeds `z` (default 2) standard errors; the bench passes when every
seed does.

Error rate: under no true gain, the per-seed paired z is approximately standard normal (n held-out prompts, hundreds),
so one seed passes by chance with probability 1 - Phi(2) = 2.3%, and all of three independent seeds with about
1.2e-5. It says nothing about a gain smaller than 2 standard errors: a failed check is "not shown", not "no gain".
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np


def paired_gain(start: list[float], final: list[float]) -> tuple[float, float]:
    """(mean of final - start, its standard error) over paired prompts."""
    d = np.asarray(final, dtype=float) - np.asarray(start, dtype=float)
    if len(d) < 2:
        return float(d.mean()) if len(d) else math.nan, math.nan
    return float(d.mean()), float(d.std(ddof=1) / math.sqrt(len(d)))


def _mean_se(x: list[float]) -> tuple[float, float]:
    a = np.asarray(x, dtype=float)
    return float(a.mean()), float(a.std(ddof=1) / math.sqrt(len(a))) if len(a) > 1 else math.nan


def score_all(trainer: Any, config: Any = None) -> list[float]:
    """The job's gate on every held-out prompt, with the gate's fixed sampling seed (training/gate.py); `config`
    (default the trainer's) sets the sampling, e.g. a greedy copy (scripts/rl-gain-trace)."""
    from training.evaluation import gold_eval
    from training.gate import batch_seed

    cfg, inputs = config or trainer.cfg, trainer.inputs
    rows = list(range(inputs.n_heldout))
    ev = gold_eval(trainer.actor, inputs.heldout_prompts(rows), cfg, tok=trainer.tok, seed=batch_seed(cfg.seed, 0),
                   prompt_ids=rows, inputs=inputs, scorer=trainer.heldout_scorer())
    return [r.gold_score for r in ev.records]


def bench_gain(config: str | Path, seeds: list[int], overlap: str = "full", steps: int | None = None,
               z: float = 2.0, say: Callable[[str], None] = print, overrides: dict | None = None) -> dict[str, Any]:
    from training.job.config import resolve_config
    from training.trainer import Trainer

    per_seed = []
    for seed in seeds:
        cfg = resolve_config(config, {**(overrides or {}), "seed": seed, **({"steps": steps} if steps else {})})
        t0 = time.perf_counter()
        trainer = Trainer(cfg, overlap)
        warm_s = time.perf_counter() - t0
        try:
            start = score_all(trainer)
            say(f"seed {seed}: start {np.mean(start):.3f} on {len(start)} held-out prompts; training {cfg.steps} steps")
            t1 = time.perf_counter()
            for rec in trainer.run(cfg.steps):
                if rec.step % max(1, cfg.steps // 10) == 0:
                    say(f"seed {seed}: step {rec.step}/{cfg.steps} reward {rec.reward_mean:+.3f}"
                        + ("" if math.isnan(rec.gold_eval) else f" gate {rec.gold_eval:.3f}"))
            train_s = time.perf_counter() - t1
            final = score_all(trainer)
        finally:
            trainer.close()
        gain, se = paired_gain(start, final)
        s_mean, s_se = _mean_se(start)
        f_mean, f_se = _mean_se(final)
        row = {"seed": seed, "start": s_mean, "start_se": s_se, "final": f_mean, "final_se": f_se, "gain": gain,
               "gain_se": se, "z": gain / se if se and se > 0 else math.nan, "heldout_prompts": len(start),
               "warm_start_s": warm_s, "train_s": train_s, "wall_s": time.perf_counter() - t0, "steps": cfg.steps}
        row["passed"] = bool(row["z"] > z)
        say(f"seed {seed}: {s_mean:.3f} -> {f_mean:.3f}, gain {gain:+.3f} ± {se:.3f} (z {row['z']:.1f}) in "
            f"{row['wall_s']:.0f} s")
        per_seed.append(row)
    return {"config": str(config), "overrides": dict(overrides or {}), "overlap": overlap, "z_required": z,
            "seeds": per_seed,
            "passed": all(r["passed"] for r in per_seed),
            "wall_s_max": max(r["wall_s"] for r in per_seed)}
