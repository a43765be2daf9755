"""`rlhfops bench ranks`: what a job on two ranks buys on this machine, and what the scorer apart buys.

Throughput (per config, at equal global batch): (a) one process with 1 torch thread, (b) one process with 2 threads,
(c) two ranks (this process and a spawned one, gloo) with 1 thread each, and (d) the machine's ceiling for two
processes: two independent one-process runs of (a) at once (spawned, started together), their samples/s summed. Two
ranks can at best reach (d): what two processes of this work get from the machine's cores, memory and caches at once,
with no collective between them; `world2_over_ceiling` is how much of it they reach.

Sequential PPO/GRPO (`overlap: none`, so every phase of a step uses the threads it is given) and `sampling: keyed` in
every column, so they draw the same tokens at the same seed (up to the float rounding of logits computed in other
batches): the same work. Each run trains one warm-up step, then `steps` steps; its samples/s is the samples trained over
the sum of those steps' wall times (on two ranks rank 0's step, which waits for the slower rank at every collective: the
job's step). Runs go round-robin over `repeats`, the order rotated each round; each figure is the median, min and max
over repeats, each ratio paired by repeat. `idle_share`: the two-rank runs' `rank_idle_s` over their step time (the most
any rank waited inside the step's collectives: for the slower rank's compute, plus the collectives themselves).

Placement (per config, one policy process, `overlap: intra` streaming the actor's chunks): colocated (the scorer
thread in the policy process) against `reward_apart` (the scorer process), beside sequential colocated; the step time
of each and the intra-overlap speedup (sequential step time over intra step time) of each placement.

Time to target (optional, long): world 1 against world 2 on one config with its held-out gates: the train clock (the
eval gates' own time left out) at the first gate reaching world 1's first gate plus `target_frac` of its best gain.

The machine's load average (os.getloadavg) is taken before and after every run.
"""

from __future__ import annotations

import os
import platform
import time

import numpy as np

from training.job.config import TrainConfig
from training.trainer import Trainer

#: throughput columns: label -> (world size, torch threads per process)
THROUGHPUT = {"world1-1thread": (1, 1), "world1-2threads": (1, 2), "world2-1thread": (2, 1),
              "two-independent-1thread": (1, 1)}
#: placement columns: label -> (overlap, placement)
PLACEMENT = {"none/colocated": ("none", "colocated"), "intra/colocated": ("intra", "colocated"),
             "intra/reward_apart": ("intra", "reward_apart")}


def bench_config(cfg: TrainConfig, quick: bool, **overrides) -> TrainConfig:
    """The bench's variant of a job config: keyed draws, the chunked engine, no gates inside the timed steps (unless
    asked), dotted `overrides`; `quick` caps responses at 32 tokens."""
    from common.validate import set_dotted

    raw = cfg.model_dump(mode="json")
    raw.update(sampling="keyed", engine="transformers", eval_every=10**9)
    if quick:
        raw["ppo"]["max_new_tokens"] = min(raw["ppo"]["max_new_tokens"], 32)
    for key, value in overrides.items():
        set_dotted(raw, key, value)
    return TrainConfig.model_validate(raw)


def _load() -> float:
    return round(float(os.getloadavg()[0]), 2)


def timed_run(cfg: TrainConfig, overlap: str, world: int, steps: int, ready=None) -> dict:
    """One run: a warm-up step, then `steps` timed ones; `world` ranks (spawned) at `cfg.oppo.torch_threads` each.
    `ready()`, when given, is called once the models are built, before the first step."""
    before, saved = _load(), os.environ.get("OMP_NUM_THREADS")
    if world > 1:  # a rank's threads (training/distributed/world.py rank_threads); the spawned rank inherits it
        os.environ["OMP_NUM_THREADS"] = str(cfg.oppo.torch_threads)
    try:
        trainer = Trainer(cfg, overlap, None, resume=False, gpus=world)
        if ready is not None:
            ready()
        rows, prev = [], 0.0
        for rec in trainer.run(steps + 1):
            rows.append((rec.wall_s - prev, rec.samples_trained, rec.rank_idle_s, rec.tokens_generated,
                         dict(rec.phase_seconds), rec.world_size))
            prev = rec.wall_s
    finally:
        if world > 1:
            os.environ.pop("OMP_NUM_THREADS", None) if saved is None else os.environ.update(OMP_NUM_THREADS=saved)
    timed = rows[1:]
    step_s = [r[0] for r in timed]
    idle = [r[2] for r in timed if np.isfinite(r[2])]
    return {"samples_per_s": sum(r[1] for r in timed) / sum(step_s), "step_s": step_s,
            "step_s_mean": float(np.mean(step_s)), "samples": [r[1] for r in timed],
            "tokens": [r[3] for r in timed],
            "idle_share": float(sum(idle) / sum(step_s)) if world > 1 and idle else None,
            "phase_s": {k: float(np.mean([r[4].get(k, 0.0) for r in timed])) for k in ("rollout", "score", "optim")},
            "world_size": timed[-1][5], "threads": trainer.threads, "load_before": before, "load_after": _load()}


def _independent_run(cfg: TrainConfig, steps: int, barrier) -> dict:
    return timed_run(cfg, "none", 1, steps, ready=barrier.wait)


def independent_pair(cfg: TrainConfig, steps: int) -> dict:
    """Column (d): two one-process runs of `cfg` at once, in two spawned processes that start their warm-up step
    together (a barrier once both have built their models); samples/s summed, each run kept."""
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    ctx = mp.get_context("spawn")
    before = _load()
    with ctx.Manager() as manager, ProcessPoolExecutor(2, mp_context=ctx) as pool:
        barrier = manager.Barrier(2)
        runs = [f.result() for f in [pool.submit(_independent_run, cfg, steps, barrier) for _ in range(2)]]
    return {"samples_per_s": sum(r["samples_per_s"] for r in runs), "each": runs,
            "step_s": [max(a, b) for a, b in zip(runs[0]["step_s"], runs[1]["step_s"], strict=True)],
            "samples": runs[0]["samples"], "tokens": runs[0]["tokens"], "idle_share": None,
            "world_size": 1, "threads": runs[0]["threads"], "processes": 2, "load_before": before,
            "load_after": _load()}


def _spread(xs: list[float]) -> dict:
    return {"median": float(np.median(xs)), "min": float(min(xs)), "max": float(max(xs)), "runs": list(xs)}


def _round_robin(columns: dict, repeats: int, run, progress=None) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {k: [] for k in columns}
    labels = list(columns)
    for rep in range(repeats):
        for label in labels[rep % len(labels):] + labels[: rep % len(labels)]:
            out[label].append(run(label))
            if progress:
                progress(label)
    return out


def throughput(cfg: TrainConfig, steps: int, repeats: int, quick: bool, progress=None) -> dict:
    """Columns (a)-(d) of the module docstring for one config; its ratios, paired by repeat; the goal's verdict."""
    def run(label):
        world, threads = THROUGHPUT[label]
        c = bench_config(cfg, quick, **{"oppo.torch_threads": threads})
        return independent_pair(c, steps) if label == "two-independent-1thread" else timed_run(c, "none", world, steps)

    runs = _round_robin(THROUGHPUT, repeats, run, progress)
    sps = {k: [r["samples_per_s"] for r in v] for k, v in runs.items()}
    two = sps["world2-1thread"]
    ratios = {"world2_over_world1_1thread": _spread([a / b for a, b in zip(two, sps["world1-1thread"], strict=True)]),
              "world2_over_world1_2threads": _spread([a / b for a, b in
                                                      zip(two, sps["world1-2threads"], strict=True)]),
              "world1_2threads_over_1thread": _spread([a / b for a, b in zip(sps["world1-2threads"],
                                                                              sps["world1-1thread"], strict=True)]),
              "ceiling_over_world1_1thread": _spread([a / b for a, b in zip(sps["two-independent-1thread"],
                                                                             sps["world1-1thread"], strict=True)]),
              "world2_over_ceiling": _spread([a / b for a, b in zip(two, sps["two-independent-1thread"],
                                                                    strict=True)])}
    r1, r2 = ratios["world2_over_world1_1thread"]["median"], ratios["world2_over_world1_2threads"]["median"]
    idle = [r["idle_share"] for r in runs["world2-1thread"] if r["idle_share"] is not None]
    return {"algorithm": cfg.algorithm, "batch_size": cfg.ppo.batch_size,
            "max_new_tokens": bench_config(cfg, quick).ppo.max_new_tokens,
            "samples_per_s": {k: _spread(v) for k, v in sps.items()}, "ratios": ratios,
            "world2_idle_share": _spread(idle) if idle else None,
            "goal": {"world2_over_world1_1thread_at_least": 1.8, "met_1thread": r1 >= 1.8,
                     "ahead_of_2threads": r2 > 1.0, "short_of_1.8x_by": max(0.0, 1.8 - r1)},
            "runs": runs}


def placement(cfg: TrainConfig, steps: int, repeats: int, quick: bool, progress=None) -> dict:
    """Colocated against reward_apart under intra-step streaming, beside sequential; one policy process."""
    def run(label):
        overlap, where = PLACEMENT[label]
        return timed_run(bench_config(cfg, quick, placement=where, **{"oppo.torch_threads": 1}), overlap, 1, steps)

    runs = _round_robin(PLACEMENT, repeats, run, progress)
    step = {k: [r["step_s_mean"] for r in v] for k, v in runs.items()}
    seq = step["none/colocated"]
    return {"algorithm": cfg.algorithm, "step_s": {k: _spread(v) for k, v in step.items()},
            "intra_speedup_colocated": _spread([a / b for a, b in zip(seq, step["intra/colocated"], strict=True)]),
            "intra_speedup_reward_apart": _spread([a / b for a, b in zip(seq, step["intra/reward_apart"],
                                                                         strict=True)]),
            "apart_over_colocated_step_speedup": _spread([a / b for a, b in zip(step["intra/colocated"],
                                                                                step["intra/reward_apart"],
                                                                                strict=True)]),
            "runs": runs}


def time_to_target(cfg: TrainConfig, steps: int, target_frac: float = 0.7, progress=None) -> dict:
    """World 1 against world 2 (1 thread each, sequential) on `cfg`'s held-out gates, over `steps` steps;
    `progress(label, step)` after every step."""
    curves = {}
    for label, world in (("world1-1thread", 1), ("world2-1thread", 2)):
        c = bench_config(cfg, False, eval_every=cfg.eval_every, **{"oppo.torch_threads": 1})
        before = _load()
        saved = os.environ.get("OMP_NUM_THREADS")
        os.environ["OMP_NUM_THREADS"] = "1"
        try:
            clock, gates = 0.0, []
            prev = 0.0
            for rec in Trainer(c, "none", None, resume=False, gpus=world).run(steps):
                clock += rec.wall_s - prev - rec.phase_seconds.get("eval", 0.0)
                prev = rec.wall_s
                if np.isfinite(rec.gold_eval):
                    gates.append((rec.step, clock, float(rec.gold_eval)))
                if progress:
                    progress(label, rec.step)
        finally:
            os.environ.pop("OMP_NUM_THREADS", None) if saved is None else os.environ.update(OMP_NUM_THREADS=saved)
        curves[label] = {"gates": gates, "load_before": before, "load_after": _load()}
    first = curves["world1-1thread"]["gates"]
    start, best = first[0][2], max(g[2] for g in first)
    target = start + target_frac * (best - start)
    for v in curves.values():
        hit = next((g for g in v["gates"] if g[2] >= target), None)
        v["time_to_target_s"], v["step_at_target"] = (hit[1], hit[0]) if hit else (None, None)
        v["final_gold"] = v["gates"][-1][2]
    t1, t2 = (curves[k]["time_to_target_s"] for k in ("world1-1thread", "world2-1thread"))
    return {"target": target, "target_frac": target_frac, "steps": steps, "curves": curves,
            "speedup": t1 / t2 if t1 and t2 else None}


def bench_ranks(configs: dict[str, TrainConfig], placement_configs: dict[str, TrainConfig], steps: int, repeats: int,
                quick: bool, target: TrainConfig | None = None, target_steps: int = 60, progress=None,
                placement_steps: int | None = None, target_progress=None) -> dict:
    """Every part of the bench (module docstring) as one JSON-ready dict; configs by name (their file's stem).
    `progress(label)` after every throughput and placement run, `target_progress(label, step)` after every step of
    the time-to-target runs."""
    t0, load0 = time.perf_counter(), os.getloadavg()
    placement_steps = placement_steps or steps
    result = {"settings": {"steps": steps, "placement_steps": placement_steps, "repeats": repeats, "quick": quick,
                           "warmup_steps": 1,
                           "throughput_overlap": "none", "sampling": "keyed"},
              "throughput": {k: throughput(c, steps, repeats, quick, progress) for k, c in configs.items()},
              "placement": {k: placement(c, placement_steps, repeats, quick, progress)
                            for k, c in placement_configs.items()},
              "time_to_target": (time_to_target(target, target_steps, progress=target_progress) if target is not None
                                 else None)}
    result["load"] = {"before": [round(x, 2) for x in load0], "after": [round(x, 2) for x in os.getloadavg()]}
    result["machine"] = {"cpus": os.cpu_count(), "python": platform.python_version(), "machine": platform.machine()}
    result["wall_s"] = time.perf_counter() - t0
    return result
