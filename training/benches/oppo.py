"""`rlhfops bench oppo`: sequential, intra, inter and full OPPO over several seeds, in one process, with the noise
of every figure reported and a comparison with a baseline run.

Interleaving. Every (variant, seed) pair is one trainer; all of them advance in round-robin, one step each in turn
(the order rotates every step), so a background process slowing the machine hits every mode and seed alike. Each
run's clock is the sum of its own step times (`StepRecord.wall_s`). The machine's load average is sampled before,
after and at every round.

Per seed (targets fixed from that seed's sequential run):
- time to proxy target: the first step at which the training reward, smoothed over a trailing window, reaches the
  sequential run's smoothed start plus `target_frac` of its best smoothed improvement;
- time to held-out gold target (the mean gate): every `gate_every` steps each run's policy is scored by the gold
  scorer on the same held-out prompts with the same sampling seed (common random numbers across runs), outside the
  run's clock; the target is the sequential run's gate-0 score plus `target_frac` of its best gain; the time is the
  run's clock at the first gate whose mean reaches it;
- final held-out gold (the last gate, at the last step: fresh samples of the final policy), tokens generated and
  trained.
Across seeds each mode reports mean +/- SE of these figures; every ratio (speedup on proxy, on gold, per step) is
a per-seed paired ratio against the same seed's sequential run, reported as median, min, max and the runs.

Quality is judged on held-out gold because the training-batch reward of inter-step overlap is biased toward the
responses that finish first (short ones): a time-to-proxy speedup is the figure that bias inflates.

`compare_with_baseline` decides which ratios regressed against an earlier run (see its docstring for the rule and
its error rate, checked by simulation in tests/training/test_bench_compare.py).
"""

from __future__ import annotations

import math
import os
import platform
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from training.benches.baseline import bench_settings, comparable  # noqa: F401 - light: the checks before torch loads
from training.job.config import TrainConfig
from training.rollout.controllers import deferral_histogram
from training.trainer import OVERLAPS, Trainer, gold_eval

PHASE_KEYS = ("rollout", "score", "sync", "optim")
#: the ratios a baseline comparison looks at: name -> (result key, modes)
RATIO_KEYS = ("speedup", "speedup_gold", "step_time_speedup")


def _smooth(x: list[float], w: int) -> np.ndarray:
    a = np.asarray(x, dtype=float)
    c = np.cumsum(np.insert(a, 0, 0.0))
    out = np.empty_like(a)
    for i in range(len(a)):
        lo = max(0, i + 1 - w)
        out[i] = (c[i + 1] - c[lo]) / (i + 1 - lo)
    return out


@dataclass
class Variant:
    """One column of the bench: an overlap mode plus config overrides (dotted keys), under a label; `config`, when
    given, replaces the bench's config for this column (another algorithm on the same task, measured against the
    reference column's targets)."""

    label: str
    overlap: str
    overrides: dict = field(default_factory=dict)
    config: TrainConfig | None = None


def config_variants(cfg: TrainConfig, modes: tuple[str, ...] = ("none", "full")) -> tuple[Variant, ...]:
    """Columns of another config (e.g. configs/grpo-bench.yaml beside configs/ppo-bench.yaml), labelled
    `<algorithm>/<mode>`: run with the bench's seeds and judged against the reference column's targets."""
    return tuple(Variant(f"{cfg.algorithm}/{m}", m, config=cfg) for m in modes)


DEFAULT_VARIANTS = tuple(Variant(m, m) for m in OVERLAPS)


def ablation_variants(bounds: tuple[int, int] = (1, 4)) -> tuple[Variant, ...]:
    """Sequential PPO, then full overlap with each correction (off, truncated IS, decoupled) at two staleness
    bounds: the ablation table of docs/oppo.md."""
    out = [Variant("none", "none")]
    for corr in ("none", "tis", "decoupled"):
        for b in bounds:
            out.append(Variant(f"full/{corr}/s{b}", "full", {"oppo.correction": corr, "oppo.max_staleness": b}))
    return tuple(out)


@dataclass
class _Run:
    variant: Variant
    seed: int
    trainer: Trainer
    records: list = field(default_factory=list)
    lengths: list[int] = field(default_factory=list)
    #: (steps done, the run's clock in s, gold mean, gold se) at every gate; gate 0 is the starting policy
    gates: list[tuple[int, float, float, float]] = field(default_factory=list)


class _SlowDecode:
    """Demonstration fault for the regression check: the wrapped engine sleeps `seconds` after every decoded
    chunk (a deliberately slowed streaming path)."""

    def __init__(self, engine, seconds: float):
        self._engine, self._seconds = engine, seconds

    def decode(self, *args, **kwargs):
        out = self._engine.decode(*args, **kwargs)
        time.sleep(self._seconds)
        return out

    def __getattr__(self, name):
        return getattr(self._engine, name)

    def __setattr__(self, name, value):
        if name in ("_engine", "_seconds"):
            object.__setattr__(self, name, value)
        else:
            setattr(self._engine, name, value)


def _config_for(cfg: TrainConfig, seed: int, overrides: dict) -> TrainConfig:
    from common.validate import set_dotted

    raw = cfg.model_dump(mode="json")
    raw["seed"] = seed
    raw["eval_every"] = 10**9  # the bench scores gates itself, outside the timed steps
    for key, value in overrides.items():
        set_dotted(raw, key, value)
    return TrainConfig.model_validate(raw)


def _gate(run: _Run, index: int, twin: _Run | None = None) -> None:
    """Score the run's policy at a gate; `twin`: a run that trains on exactly the same samples (intra-step
    streaming changes when scores are computed, not what is trained: tests/training/test_training_trainer.py), whose
    score at this gate is reused (its policy is the same), so gates cost a quarter less."""
    tr = run.trainer
    wall = run.records[-1].wall_s if run.records else 0.0
    if twin is not None:
        _, _, mean, se = twin.gates[index]
    else:
        n = min(tr.cfg.eval_prompts, tr.inputs.n_heldout)
        ev = gold_eval(tr.actor, tr.inputs.heldout_prompts(range(n)), tr.cfg, tok=tr.tok, seed=1000 + index,
                       inputs=tr.inputs, scorer=tr.heldout_scorer())
        mean, se = float(ev.mean), float(ev.se)
    run.gates.append((len(run.records), float(wall), mean, se))


def _load() -> float:
    return float(os.getloadavg()[0])


def _scheduling() -> dict:
    """What the load average does not say: this process's nice value, and whether the kernel groups processes by
    session (autogroup), in which case nice values only order processes within one session and a niced process in
    another session still takes an equal share of the CPU."""
    try:
        autogroup = Path("/proc/sys/kernel/sched_autogroup_enabled").read_text().strip() == "1"
    except OSError:
        autogroup = None
    return {"nice": os.getpriority(os.PRIO_PROCESS, 0), "autogroup": autogroup}


def bench_oppo(cfg: TrainConfig, steps: int, smooth: int = 8, target_frac: float = 0.7, progress=None,
               seeds: tuple[int, ...] | None = None, gate_every: int = 5,
               variants: tuple[Variant, ...] = DEFAULT_VARIANTS, slow_intra_s: float = 0.0) -> dict:
    """Run every variant for every seed for `steps` steps, interleaved; return every figure (module docstring).
    The first variant is the reference every ratio is taken against. `slow_intra_s` > 0 slows the "intra"
    variant's decoding by that many seconds per chunk (only to demonstrate the regression check)."""
    seeds = tuple(seeds) if seeds else (cfg.seed,)
    load = {"before_1m": _load(), "samples_1m": [], **_scheduling()}
    runs: list[_Run] = []
    for seed in seeds:
        for v in variants:
            tr = Trainer(_config_for(v.config or cfg, seed, v.overrides), v.overlap, out_dir=None, resume=False)
            if slow_intra_s > 0 and v.label == "intra":
                tr.engine = _SlowDecode(tr.engine, slow_intra_s)
            runs.append(_Run(v, seed, tr))
    # intra trains on the same samples as sequential with the same overrides: it reuses sequential's gate scores
    twins = {id(r): next((t for t in runs if t.seed == r.seed and t.variant.overlap == "none"
                          and t.variant.overrides == r.variant.overrides and t.variant.config is r.variant.config),
                         None)
             for r in runs if r.variant.overlap == "intra" and slow_intra_s == 0}
    gated = sorted(runs, key=lambda r: id(r) in twins)  # twins' sources first

    def gate_all(index: int) -> None:
        for run in gated:
            _gate(run, index, twins.get(id(run)))

    n_gates = 0
    gate_all(n_gates)
    n_gates += 1
    t_start = time.perf_counter()
    for step in range(steps):
        k = step % len(runs)
        for run in runs[k:] + runs[:k]:
            rec = run.trainer.train_step()
            run.records.append(rec)
            run.lengths.extend(run.trainer.last_response_lengths)
        load["samples_1m"].append(_load())
        if (step + 1) % gate_every == 0 or step + 1 == steps:
            gate_all(n_gates)
            n_gates += 1
        if progress:
            progress(step + 1, steps)
    bench_wall = time.perf_counter() - t_start
    load["after_1m"] = _load()
    s = load["samples_1m"]
    load.update(min_1m=min(s), max_1m=max(s), mean_1m=float(np.mean(s)), cpus=os.cpu_count())

    ref = variants[0].label
    per_seed: dict[str, list[dict]] = {v.label: [] for v in variants}
    for seed in seeds:
        by_label = {r.variant.label: r for r in runs if r.seed == seed}
        base = by_label[ref]
        base_sm = _smooth([r.reward_mean for r in base.records], smooth)
        start = float(np.mean([r.reward_mean for r in base.records[:smooth]]))
        target = start + target_frac * (float(base_sm.max()) - start)
        g0 = base.gates[0][2]
        target_gold = g0 + target_frac * (max(g[2] for g in base.gates) - g0)
        for v in variants:
            per_seed[v.label].append(_summarise(by_label[v.label], smooth, target, target_gold))

    modes = {label: _aggregate(rows) for label, rows in per_seed.items()}
    others = [v.label for v in variants[1:]]
    ratios = {
        "speedup": _ratios(per_seed, ref, others, "time_to_reward_s"),
        "speedup_gold": _ratios(per_seed, ref, others, "time_to_gold_s"),
        "step_time_speedup": _ratios(per_seed, ref, others, "step_s_mean"),
    }
    gap = {}
    for label in others:  # final held-out gold of each mode minus the reference's, paired by seed
        d = [a["final_gold_heldout"] - b["final_gold_heldout"] for a, b in
             zip(per_seed[label], per_seed[ref], strict=True)]
        gap[label] = {"mean": float(np.mean(d)), "se": _se(d), "runs": d}
    lens = np.asarray([n for r in runs if r.variant.label == ref for n in r.lengths])
    med = float(np.median(lens))
    return {
        "modes": modes, "per_seed": per_seed, "ratios": ratios,
        # the medians over seeds, under today's keys
        "speedup": {k: v["median"] for k, v in ratios["speedup"].items()},
        "speedup_gold": {k: v["median"] for k, v in ratios["speedup_gold"].items()},
        "step_time_speedup": {k: v["median"] for k, v in ratios["step_time_speedup"].items()},
        "final_gold_gap": gap,
        "reference": ref, "variants": [{"label": v.label, "overlap": v.overlap, "overrides": v.overrides,
                                        **({"config": v.config.model_dump(mode="json")} if v.config else {})}
                                       for v in variants],
        "seeds": list(seeds), "target_frac": target_frac, "smooth_window": smooth, "gate_every": gate_every,
        "steps": steps, "slow_intra_s": slow_intra_s, "load": load,
        "workload": {
            "responses": int(len(lens)), "median_len": med, "p90_len": float(np.percentile(lens, 90)),
            "max_len": int(lens.max()), "frac_ge_4x_median": float(np.mean(lens >= 4 * med)),
            "long_tailed": bool(np.mean(lens >= 4 * med) >= 0.10),
        },
        "bench_wall_s": bench_wall, "config": cfg.model_dump(mode="json"),
        "python": platform.python_version(), "machine": platform.machine(),
    }


def _summarise(run: _Run, smooth: int, target: float, target_gold: float) -> dict:
    recs, tr = run.records, run.trainer
    rewards = [r.reward_mean for r in recs]
    sm = _smooth(rewards, smooth)
    wall = np.array([r.wall_s for r in recs])
    hit = np.nonzero(sm >= target)[0]
    idx = int(hit[0]) if len(hit) else None
    gold_hit = [g for g in run.gates[1:] if g[2] >= target_gold]
    samples = sum(r.samples_trained for r in recs)
    final_gate = run.gates[-1]  # the last gate is at the last step
    phases = {k: float(sum(r.phase_seconds.get(k, 0.0) for r in recs)) for k in PHASE_KEYS}

    def nanmean(key):
        v = np.array([getattr(r, key) for r in recs], dtype=float)
        return float(np.nanmean(v)) if np.isfinite(v).any() else None

    return {
        "seed": run.seed,
        "time_to_reward_s": float(wall[idx]) if idx is not None else None,
        "steps_to_reward": idx + 1 if idx is not None else None,
        "time_to_gold_s": gold_hit[0][1] if gold_hit else None,
        "steps_to_gold": gold_hit[0][0] if gold_hit else None,
        "target_reward": target, "target_gold": target_gold,
        "samples_per_s": samples / float(wall[-1]),
        "final_reward": float(np.mean(rewards[-smooth:])),
        "final_gold_heldout": final_gate[2], "final_gold_heldout_prompt_se": final_gate[3],
        "wall_s": float(wall[-1]), "step_s_mean": float(wall[-1]) / len(recs),
        "phase_seconds": phases, "phase_share": {k: v / float(wall[-1]) for k, v in phases.items()},
        "decode_steps_mean": float(np.mean([r.decode_steps for r in recs])),
        "response_len_mean": float(np.mean(run.lengths)),
        "tokens_generated": int(sum(r.tokens_generated for r in recs)),
        "tokens_trained": int(sum(r.tokens_trained for r in recs)),
        "samples_trained": samples,
        "delta_mean": float(np.mean([r.delta for r in recs])), "delta_final": recs[-1].delta,
        "chunk_size_final": recs[-1].chunk_size,
        "staleness_mean": nanmean("staleness_mean"), "stale_frac": nanmean("stale_frac"),
        "staleness_max": float(np.nanmax([r.staleness_max for r in recs])),
        "is_ess_mean": nanmean("is_ess"),
        "is_ess_min": float(np.nanmin([r.is_ess for r in recs])),
        "is_weight_max": float(np.nanmax([r.is_weight_max for r in recs])),
        "deferral_histogram": deferral_histogram(tr.deferral_counts),
        "gold_gates": [list(g) for g in run.gates],
        "reward_curve": rewards, "wall_curve": wall.tolist(),
    }


def _se(x: list[float]) -> float | None:
    return float(np.std(x, ddof=1) / math.sqrt(len(x))) if len(x) > 1 else None


#: per-seed figures averaged over seeds (mean, with `<key>_se` beside it)
_MEAN_KEYS = ("time_to_reward_s", "steps_to_reward", "time_to_gold_s", "steps_to_gold", "samples_per_s",
              "final_reward", "final_gold_heldout", "wall_s", "step_s_mean",
              "decode_steps_mean", "response_len_mean", "tokens_generated", "tokens_trained", "samples_trained",
              "delta_mean", "staleness_mean", "stale_frac", "is_ess_mean")


def _aggregate(rows: list[dict]) -> dict:
    """One mode over seeds: mean and SE (over seeds) of every figure; a time the mode never reached in some seed
    is left out of the mean and counted in `<key>_reached`. Curves and histograms are the first seed's."""
    out: dict[str, Any] = {"n_seeds": len(rows)}
    for key in _MEAN_KEYS:
        vals = [r[key] for r in rows if r[key] is not None]
        out[key] = float(np.mean(vals)) if vals else None
        out[f"{key}_se"] = _se(vals)
        if key.startswith(("time_to", "steps_to")):
            out[f"{key}_reached"] = len(vals)
    out["is_ess_min"] = float(min(r["is_ess_min"] for r in rows))
    out["is_weight_max"] = float(max(r["is_weight_max"] for r in rows))
    out["staleness_max"] = float(max(r["staleness_max"] for r in rows))
    phases = {k: float(np.mean([r["phase_seconds"][k] for r in rows])) for k in PHASE_KEYS}
    out["phase_seconds"] = phases
    out["phase_share"] = {k: float(np.mean([r["phase_share"][k] for r in rows])) for k in PHASE_KEYS}
    for key in ("chunk_size_final", "delta_final", "deferral_histogram", "reward_curve", "wall_curve", "gold_gates"):
        out[key] = rows[0][key]
    return out


def _ratios(per_seed: dict[str, list[dict]], ref: str, others: list[str], key: str) -> dict:
    """Per seed: reference's figure / the mode's (higher is faster), paired by seed; median, min, max over seeds
    (over the seeds where both reached the target)."""
    out = {}
    for label in others:
        runs = []
        for a, b in zip(per_seed[ref], per_seed[label], strict=True):
            runs.append(a[key] / b[key] if a[key] and b[key] else None)
        ok = [r for r in runs if r is not None]
        out[label] = {"median": float(np.median(ok)) if ok else None, "min": min(ok) if ok else None,
                      "max": max(ok) if ok else None, "runs": runs}
    return out


def compare_with_baseline(result: dict, baseline: dict, min_drop: float = 0.10) -> list[dict]:
    """Which ratios fell beyond their noise, against a baseline run of the same settings.

    A ratio (e.g. speedup.intra) is REGRESSED when both hold:
    1. its spreads over seeds do not overlap: every seed's ratio of this run is below every seed's ratio of the
       baseline (current max < baseline min);
    2. its median fell by more than `min_drop` (10%) of the baseline median.
    Why this rule: seeds are paired (same seeds, same trajectories), so a ratio's seed-to-seed spread is its
    noise; under no change, n current and n baseline values are exchangeable and (1) alone has probability
    1 / C(2n, n) (1/20 for n = 3); (2) removes drops too small to matter. Round-robin interleaving makes a busy
    machine slow every mode alike, so ratios move little while absolute times move a lot. The family-wise false
    alarm rate over the 9 ratios is measured by simulation in tests/training/test_bench_compare.py.
    Ratios missing in either run (a target not reached) are reported, never flagged."""
    rows = []
    for key in RATIO_KEYS:
        cur_all, base_all = result.get("ratios", {}).get(key, {}), baseline.get("ratios", {}).get(key, {})
        for mode in sorted(set(cur_all) & set(base_all)):
            cur = [r for r in cur_all[mode]["runs"] if r is not None]
            base = [r for r in base_all[mode]["runs"] if r is not None]
            row = {"ratio": f"{key}.{mode}", "baseline_median": None, "current_median": None,
                   "baseline_range": None, "current_range": None, "change": None, "regressed": False}
            if cur and base:
                bm, cm = float(np.median(base)), float(np.median(cur))
                row.update(baseline_median=bm, current_median=cm, baseline_range=[min(base), max(base)],
                           current_range=[min(cur), max(cur)], change=cm / bm - 1.0)
                row["regressed"] = bool(max(cur) < min(base) and cm < (1.0 - min_drop) * bm)
            rows.append(row)
    return rows


def regression_check(cfg: TrainConfig, settings: dict, baseline: dict | None = None, baseline_name: str = "",
                     out: Path | None = None, *, quick: bool = False, variants: tuple[Variant, ...] = DEFAULT_VARIANTS,
                     slow_intra_s: float = 0.0, progress=None) -> dict:
    """`bench_oppo` at `settings` (`bench_settings`), compared with `baseline` (a JSON of the same settings, checked
    by the caller with `comparable`) when given: `result["baseline_comparison"]` holds the rows of
    `compare_with_baseline` and `regressed`, the names of the ratios that fell beyond their noise. With `out`, the
    JSON is written there and its plot beside it (.png). What `rlhfops bench oppo --baseline` and the nightly's bench
    stage run."""
    import json

    result = bench_oppo(cfg, settings["steps"], smooth=settings["smooth_window"], target_frac=settings["target_frac"],
                        seeds=tuple(settings["seeds"]), gate_every=settings["gate_every"], variants=variants,
                        slow_intra_s=slow_intra_s, progress=progress)
    result["quick"] = quick
    if baseline is not None:
        rows = compare_with_baseline(result, baseline)
        result["baseline_comparison"] = {"baseline": baseline_name, "rows": rows,
                                         "regressed": [r["ratio"] for r in rows if r["regressed"]]}
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2) + "\n")
        plot_bench(result, out.with_suffix(".png"))
    return result


def proxy_eval(tr: Trainer, seed: int) -> tuple[float, float]:
    """Proxy reward of the final policy on held-out prompts (fresh samples, so no selection bias:
    inter-step overlap trains on the first B to finish, which skews its training-batch reward)."""
    import torch

    from training.rollout.engine import IncrementalScorer, left_pad
    from training.trainer import generate

    cfg = tr.cfg
    rows = range(min(cfg.eval_prompts, tr.inputs.n_heldout))
    prompts = tr.inputs.heldout_prompts(rows)
    responses = generate(tr.actor, tr.tok, prompts, cfg.ppo.max_new_tokens, cfg.ppo.temperature, seed=seed,
                         render=tr.inputs.render)
    if tr.reward_fn is not None:  # the job's reward is a function: its scores of the held-out responses
        got = tr.reward_fn(prompts, [tr.tok.decode(r) for r in responses], tr.inputs.columns("heldout", list(rows)))
        scores = np.array([np.nan if s is None else s for s in got.scores], dtype=float)
        scores = scores[np.isfinite(scores)]
    else:
        seqs = [tr.tok.encode(tr.inputs.render(p)) + r for p, r in zip(prompts, responses, strict=True)]
        ids, attn = left_pad(seqs, tr.tok.pad_id)
        with torch.no_grad(), tr.autocast():
            scores = IncrementalScorer(tr.reward_model, "reward").begin(ids.to(tr.device), attn.to(tr.device))[:, -1]
        scores = scores.float().cpu().numpy()
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
        gates = np.array(m["gold_gates"])
        ax2.plot(gates[:, 1], gates[:, 2], marker="o", ms=3, label=mode)
    first = result["per_seed"][result["reference"]][0]
    ax1.axhline(first["target_reward"], color="grey", ls="--", lw=1, label="target")
    ax2.axhline(first["target_gold"], color="grey", ls="--", lw=1, label="target")
    ax1.set_ylabel(f"proxy reward (trailing mean of {w})")
    ax2.set_ylabel("held-out gold (gate mean)")
    for ax in (ax1, ax2):
        ax.set_xlabel(f"training wall time (s), seed {result['seeds'][0]}")
        ax.legend(fontsize=7)
    sp, sg = result["speedup"], result["speedup_gold"]
    fmt = lambda d: ", ".join(f"{k} {v:.2f}x" if v else f"{k} n/a" for k, v in d.items())  # noqa: E731
    fig.suptitle(f"OPPO on CPU, median over {len(result['seeds'])} seeds: proxy {fmt(sp)}; gold {fmt(sg)}",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def load_lines(result: dict) -> list[str]:
    """What the machine's load was while a bench ran, as the lines `rlhfops bench oppo` prints."""
    ld = result["load"]
    out = [f"load average (1 min) while it ran: before {ld['before_1m']:.2f}, after {ld['after_1m']:.2f}, "
           f"min {ld['min_1m']:.2f}, max {ld['max_1m']:.2f}, mean {ld['mean_1m']:.2f} on {ld['cpus']} CPUs; "
           f"bench wall {result['bench_wall_s']:.0f} s"]
    if "nice" in ld:
        group = {True: "on: nice orders processes only within a session",
                 False: "off: nice orders every process", None: "unknown"}[ld.get("autogroup")]
        out.append(f"this process ran at nice {ld['nice']}; kernel autogroup {group}")
    return out


def format_mean_se(m: dict, key: str, digits: int = 1, seeds_word: str = "") -> str:
    """A mode's figure as `mean ± SE` over seeds; "not reached" when no seed reached it, and `(k/n)` (plus
    `seeds_word`) when only k of the n seeds did."""
    v, se = m.get(key), m.get(f"{key}_se")
    if v is None:
        return "not reached"
    out = f"{v:.{digits}f}" + (f" ± {se:.{digits}f}" if se is not None else "")
    reached = m.get(f"{key}_reached")
    if reached is not None and reached < m["n_seeds"]:
        out += f" ({reached}/{m['n_seeds']}{seeds_word})"
    return out


def format_ratio(r: dict | None, missing: str = "n/a", lbracket: str = "[") -> str:
    """A per-seed ratio as `median x [min-max]` (`lbracket` "\\[" for rich markup), `missing` without a median."""
    if not r or r.get("median") is None:
        return missing
    return f"{r['median']:.2f}x {lbracket}{r['min']:.2f}-{r['max']:.2f}]"


def markdown_table(result: dict) -> str:
    """The bench's result as the markdown table docs/oppo.md shows: per variant, mean +/- SE over seeds of the
    times to the gold and proxy targets, the per-seed ratios (median [min-max]), final held-out gold and its paired
    gap to the reference, tokens, the importance weights' ESS and the stale share of trained tokens."""
    ref = result["reference"]

    def pm(m: dict, key: str, digits: int) -> str:
        return format_mean_se(m, key, digits, " seeds")

    def ratio(kind: str, label: str) -> str:
        return "1.00x" if label == ref else format_ratio(result["ratios"][kind].get(label), missing="not reached")

    rows = ["| variant | time to gold target s | speedup (gold) | time to proxy target s | speedup (proxy) | "
            "step-time speedup | final held-out gold | gold - sequential (paired) | tokens generated | "
            "tokens trained | ESS mean / min | stale tokens |",
            "|" + "---|" * 12]
    for v in result["variants"]:
        label, m = v["label"], result["modes"][v["label"]]
        gap = result["final_gold_gap"].get(label)
        gap_s = "-" if gap is None else f"{gap['mean']:+.3f}" + ("" if gap["se"] is None else f" ± {gap['se']:.3f}")
        rows.append(
            f"| {label} | {pm(m, 'time_to_gold_s', 1)} | {ratio('speedup_gold', label)} | "
            f"{pm(m, 'time_to_reward_s', 1)} | {ratio('speedup', label)} | {ratio('step_time_speedup', label)} | "
            f"{pm(m, 'final_gold_heldout', 3)} | {gap_s} | {pm(m, 'tokens_generated', 0)} | "
            f"{pm(m, 'tokens_trained', 0)} | "
            f"{m['is_ess_mean']:.3f} / {m['is_ess_min']:.2f} | {m['stale_frac']:.3f} |")
    ld = result["load"]
    nice = f", this process at nice {ld['nice']}, autogroup {'on' if ld.get('autogroup') else 'off'}" \
        if "nice" in ld else ""
    rows.append("")
    rows.append(f"{result['steps']} steps, seeds {result['seeds']}, gate every {result['gate_every']} steps; load "
                f"average (1 min) {ld['min_1m']:.1f}-{ld['max_1m']:.1f} (mean {ld['mean_1m']:.1f}) on {ld['cpus']} "
                f"CPUs{nice}; bench wall {result['bench_wall_s']:.0f} s.")
    return "\n".join(rows)


if __name__ == "__main__":  # python -m training.benches.oppo RESULT.json: the markdown table of a saved bench result
    import json
    import sys

    for name in sys.argv[1:]:
        print(markdown_table(json.loads(Path(name).read_text())))
