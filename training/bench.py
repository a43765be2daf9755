"""`rlhfops bench oppo`: sequential, intra, inter and full OPPO from the same seed and prompts, in one process.

The four trainers advance in round-robin, one step each in turn (the order rotates every step), so a
background process slowing the machine hits every mode alike; each mode's clock is the sum of its own
step times. Time-to-reward: the first step at which a mode's reward, smoothed over a trailing window,
reaches the target, and that mode's training wall seconds up to there. The target is fixed from the
sequential run: its smoothed start plus `target_frac` of its best smoothed improvement.

Quality is compared on fresh held-out samples of each final policy (gold and proxy): the training-batch
reward of inter-step overlap is biased toward responses that finish first, so it is not a fair
quality figure on its own.
"""

from __future__ import annotations

import math
import platform
import time
from pathlib import Path

import numpy as np

from training.config import TrainConfig
from training.oppo import deferral_histogram
from training.trainer import OVERLAPS, Trainer, gold_eval

PHASE_KEYS = ("rollout", "score", "sync", "optim")


def _smooth(x: list[float], w: int) -> np.ndarray:
    a = np.asarray(x, dtype=float)
    c = np.cumsum(np.insert(a, 0, 0.0))
    out = np.empty_like(a)
    for i in range(len(a)):
        lo = max(0, i + 1 - w)
        out[i] = (c[i + 1] - c[lo]) / (i + 1 - lo)
    return out


def bench_oppo(cfg: TrainConfig, steps: int, smooth: int = 8, target_frac: float = 0.7, progress=None) -> dict:
    """Run all four modes for `steps` steps; return every figure (see module docstring)."""
    cfg = cfg.model_copy(deep=True)
    cfg.eval_every = 10**9  # gold evals only at the end, outside the timed steps
    trainers = {}
    for mode in OVERLAPS:
        trainers[mode] = Trainer(cfg, mode, out_dir=None, resume=False)
    lengths: dict[str, list[int]] = {m: [] for m in OVERLAPS}
    records: dict[str, list] = {m: [] for m in OVERLAPS}
    t_start = time.perf_counter()
    for step in range(steps):
        order = OVERLAPS[step % 4 :] + OVERLAPS[: step % 4]
        for mode in order:
            tr = trainers[mode]
            rec = tr.train_step()
            records[mode].append(rec)
            lengths[mode].extend(tr.last_response_lengths)
        if progress:
            progress(step + 1, steps)
    bench_wall = time.perf_counter() - t_start

    base = records["none"]
    base_smooth = _smooth([r.reward_mean for r in base], smooth)
    start = float(np.mean([r.reward_mean for r in base[:smooth]]))
    target = start + target_frac * (float(base_smooth.max()) - start)

    modes = {}
    for mode in OVERLAPS:
        recs = records[mode]
        rewards = [r.reward_mean for r in recs]
        sm = _smooth(rewards, smooth)
        wall = np.array([r.wall_s for r in recs])  # the mode's own cumulative step time
        hit = np.nonzero(sm >= target)[0]
        idx = int(hit[0]) if len(hit) else None
        samples = sum(r.samples_trained for r in recs)
        tr = trainers[mode]
        ev = gold_eval(tr.actor, None, cfg, tok=tr.tok, seed=12345)
        proxy = proxy_eval(tr, seed=12345)
        phases = {k: float(sum(r.phase_seconds.get(k, 0.0) for r in recs)) for k in PHASE_KEYS}
        modes[mode] = {
            "time_to_reward_s": float(wall[idx]) if idx is not None else None,
            "steps_to_reward": idx + 1 if idx is not None else None,
            "samples_per_s": samples / float(wall[-1]),
            "final_reward": float(np.mean(rewards[-smooth:])),
            "final_reward_se": float(np.std(rewards[-smooth:], ddof=1) / math.sqrt(min(smooth, len(rewards)))),
            "final_gold_heldout": ev.mean, "final_gold_heldout_se": ev.se,
            "final_proxy_heldout": proxy[0], "final_proxy_heldout_se": proxy[1],
            "wall_s": float(wall[-1]), "step_s_mean": float(wall[-1]) / len(recs),
            "phase_seconds": phases,
            "phase_share": {k: v / float(wall[-1]) for k, v in phases.items()},
            "decode_steps_mean": float(np.mean([r.decode_steps for r in recs])),
            "tokens_generated": int(sum(r.tokens_generated for r in recs)),
            "tokens_trained": int(sum(r.tokens_trained for r in recs)),
            "samples_trained": samples,
            "delta_mean": float(np.mean([r.delta for r in recs])),
            "delta_final": recs[-1].delta,
            "chunk_size_final": recs[-1].chunk_size,
            "staleness_mean": float(np.nanmean([r.staleness_mean for r in recs])),
            "deferral_histogram": deferral_histogram(tr.deferral_counts),
            "reward_curve": rewards,
            "wall_curve": wall.tolist(),
        }
    speedup = {}
    for mode in ("intra", "inter", "full"):
        a, b = modes["none"]["time_to_reward_s"], modes[mode]["time_to_reward_s"]
        speedup[mode] = (a / b) if (a and b) else None
    step_speedup = {m: modes["none"]["step_s_mean"] / modes[m]["step_s_mean"] for m in ("intra", "inter", "full")}
    lens = np.asarray(lengths["none"])
    med = float(np.median(lens))
    early = np.asarray(lengths["none"][: 10 * cfg.ppo.batch_size])  # the first 10 steps: the workload as given
    workload = {
        "responses": int(len(lens)), "median_len": med, "p90_len": float(np.percentile(lens, 90)),
        "max_len": int(lens.max()), "frac_ge_4x_median": float(np.mean(lens >= 4 * med)),
        "long_tailed": bool(np.mean(lens >= 4 * med) >= 0.10),
        "first10_median_len": float(np.median(early)),
        "first10_frac_ge_4x_median": float(np.mean(early >= 4 * np.median(early))),
    }
    return {
        "modes": modes, "speedup": speedup, "step_time_speedup": step_speedup,
        "target_reward": target, "target_frac": target_frac, "smooth_window": smooth, "steps": steps,
        "workload": workload, "bench_wall_s": bench_wall,
        "config": cfg.model_dump(mode="json"), "python": platform.python_version(), "machine": platform.machine(),
    }


def proxy_eval(tr: Trainer, seed: int) -> tuple[float, float]:
    """Proxy reward of the final policy on held-out prompts (fresh samples, so no selection bias:
    inter-step overlap trains on the first B to finish, which skews its training-batch reward)."""
    import torch

    from training.engine import IncrementalScorer, left_pad
    from training.models import format_prompt
    from training.trainer import generate

    cfg = tr.cfg
    prompts = tr.prompts.heldout[: cfg.eval_prompts]
    responses = generate(tr.actor, tr.tok, prompts, cfg.ppo.max_new_tokens, cfg.ppo.temperature, seed=seed)
    seqs = [tr.tok.encode(format_prompt(p)) + r for p, r in zip(prompts, responses, strict=True)]
    ids, attn = left_pad(seqs, tr.tok.pad_id)
    with torch.no_grad():
        scores = IncrementalScorer(tr.reward_model, "reward").begin(ids, attn)[:, -1].numpy()
    return float(scores.mean()), float(scores.std(ddof=1) / math.sqrt(len(scores)))


def plot_bench(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    w = result["smooth_window"]
    for mode, m in result["modes"].items():
        sm = _smooth(m["reward_curve"], w)
        ax1.plot(m["wall_curve"], sm, label=mode)
        ax2.plot(np.arange(1, len(sm) + 1), sm, label=mode)
    for ax, xl in ((ax1, "training wall time (s)"), (ax2, "PPO step")):
        ax.axhline(result["target_reward"], color="grey", ls="--", lw=1, label="target")
        ax.set_xlabel(xl)
        ax.set_ylabel(f"proxy reward (trailing mean of {w})")
        ax.legend()
    sp = result["speedup"]
    fig.suptitle("OPPO on CPU: time-to-reward speedup " + ", ".join(
        f"{k} {v:.2f}x" if v else f"{k} n/a" for k, v in sp.items()))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
