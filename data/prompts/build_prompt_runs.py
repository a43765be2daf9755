"""Record the per-prompt corpus declared in data/prompts/DECLARATION.md: this trainer's PPO runs, every held-out
prompt scored with common random numbers at step 0 and at every gate.

    python data/prompts/build_prompt_runs.py --list
    python data/prompts/build_prompt_runs.py --half a --workers 16 --work runs/prompts-work --deadline 540
    python data/prompts/build_prompt_runs.py --assemble --work runs/prompts-work

The fresh report part (data/prompts/DECLARATION-fresh.md: the same variants on seeds 72-91, recorded sealed):

    python data/prompts/build_prompt_runs.py --part fresh --list
    python data/prompts/build_prompt_runs.py --part fresh --workers 16 --work runs/prompts-fresh-work --deadline 540
    python data/prompts/build_prompt_runs.py --part fresh --assemble --work runs/prompts-fresh-work

Each run writes `<work>/<run>.trace.csv` (one row per checkpoint, Trace-CSV format) and `<work>/<run>.prompts.csv`
(one row per prompt and checkpoint: the `eval.prompt_records` format); the trace file is written last and marks the
run done. Runs are grouped by seed (one task per seed and half, so a seed's warm start is built once per process);
`--deadline S` starts no run after S seconds (the finished runs are kept, the rest are left for another call).
`--assemble` merges the finished runs: the tune part into `data/prompts/tune/` (traces.csv, prompts.csv.gz), the
report part into `data/prompts/report/` (recorded into `data/sealed/prompts_report/` and unread until the paired
rule and its defaults were committed), printing run and row counts; with `--part fresh`, the fresh part into
`data/sealed/prompts_fresh/` (sealed: nothing reads it until it is moved, DECLARATION-fresh.md).
"""

from __future__ import annotations

import argparse
import copy
import csv
import gzip
import math
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
BASE_CONFIG = REPO / "configs" / "ppo-healthy.yaml"
STEPS = 100
EVAL_EVERY = 5
EVAL_PROMPTS = 64
HELDOUT = 128
EXTRA_BATCH = 32
TUNE_SEEDS = (56, 57, 58, 59)
REPORT_SEEDS = tuple(range(60, 72))
TUNE_DIR = REPO / "data" / "prompts" / "tune"
#: the report part was recorded into data/sealed/prompts_report/ and moved here once the paired rule and its defaults
#: were committed (eval/paired.py at b05e9aa: alpha 0.02, margin 0, min_prompts 10, warmup 0)
REPORT_DIR = REPO / "data" / "prompts" / "report"
#: the fresh report part (DECLARATION-fresh.md): seeds 72-91, recorded into data/sealed/prompts_fresh/ and read once,
#: after it is moved to data/prompts/fresh/, by the table's command
FRESH_SEEDS = tuple(range(72, 92))
FRESH_DIR = REPO / "data" / "sealed" / "prompts_fresh"
#: part -> (its declared seeds, where --assemble writes it)
PARTS = {"tune": (TUNE_SEEDS, TUNE_DIR), "report": (REPORT_SEEDS, REPORT_DIR), "fresh": (FRESH_SEEDS, FRESH_DIR)}

_GAME = {"kind": "gameable_reward", "bonus": 0.5}
#: (name, overrides) as declared; half "a" is the first five, half "b" the last five (each 3 plain + 2 gameable)
VARIANTS: tuple[tuple[str, dict], ...] = (
    ("kl0.2-lr3e-4", {"ppo": {"kl_coef": 0.2, "actor_lr": 3e-4}}),
    ("kl0.1-lr3e-4", {"ppo": {"kl_coef": 0.1, "actor_lr": 3e-4}}),
    ("kl0.05-lr1e-4", {"ppo": {"kl_coef": 0.05, "actor_lr": 1e-4}}),
    ("game40-kl0.05-lr3e-4", {"ppo": {"kl_coef": 0.05, "actor_lr": 3e-4}, "fault": {**_GAME, "at_step": 40}}),
    ("game40-kl0.02-lr3e-4", {"ppo": {"kl_coef": 0.02, "actor_lr": 3e-4}, "fault": {**_GAME, "at_step": 40}}),
    ("kl0.2-lr1e-4", {"ppo": {"kl_coef": 0.2, "actor_lr": 1e-4}}),
    ("kl0.1-lr1e-4", {"ppo": {"kl_coef": 0.1, "actor_lr": 1e-4}}),
    ("kl0.05-lr3e-4", {"ppo": {"kl_coef": 0.05, "actor_lr": 3e-4}}),
    ("game30-kl0.05-lr3e-4", {"ppo": {"kl_coef": 0.05, "actor_lr": 3e-4}, "fault": {**_GAME, "at_step": 30}}),
    ("game40-kl0.1-lr3e-4", {"ppo": {"kl_coef": 0.1, "actor_lr": 3e-4}, "fault": {**_GAME, "at_step": 40}}),
)
TRACE_COLUMNS = ("run_id", "step", "eval_score", "eval_se", "reward", "loss", "kl", "entropy", "grad_norm",
                 "response_len", "gate_s", "pool_s", "kl_coef", "actor_lr", "gameable", "seed")
PROMPT_COLUMNS = ("run_id", "step", "prompt_id", "gold_score", "seed", "proxy_score", "response_len")


def run_id(name: str, seed: int) -> str:
    return f"own-prompts/{name}/seed{seed}"


def part_of(seed: int) -> str:
    return next(part for part, (seeds, _) in PARTS.items() if seed in seeds)


def grid(seeds=TUNE_SEEDS + REPORT_SEEDS) -> list[tuple[str, dict, int]]:
    return [(run_id(name, seed), over, seed) for seed in seeds for name, over in VARIANTS]


def _merge(base: dict, over: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in over.items():
        out[key] = _merge(out.get(key, {}), value) if isinstance(value, dict) else value
    return out


def run_config(overrides: dict, seed: int, cache_dir: Path, steps: int = STEPS):
    from training.job.config import TrainConfig

    raw = yaml.safe_load(BASE_CONFIG.read_text())
    raw = _merge(raw, {"name": "corpus-prompts", "seed": seed, "steps": steps, "eval_every": EVAL_EVERY,
                       "eval_prompts": EVAL_PROMPTS, "eval_extra_batch": EXTRA_BATCH, "checkpoint_every": 10_000,
                       "task": {"n_heldout_prompts": HELDOUT}, "oppo": {"torch_threads": 1},
                       "cache_dir": str(cache_dir)})
    return TrainConfig.model_validate(_merge(raw, overrides))


def _fmt(v):
    return f"{v:.5g}" if isinstance(v, float) else v


def _write(path: Path, columns, rows: list[dict]) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    with tmp.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=columns)
        w.writeheader()
        for r in rows:
            w.writerow({k: _fmt(r[k]) for k in columns})
    tmp.replace(path)


def _file(work: Path, rid: str, kind: str) -> Path:
    return work / f"{rid.replace('/', '__')}.{kind}.csv"


def train_one(rid: str, overrides: dict, seed: int, work: Path, cache_dir: Path, steps: int = STEPS) -> float:
    """Train one run and write its two files; returns its wall seconds."""
    from training.trainer import Trainer

    t0 = time.perf_counter()
    cfg = run_config(overrides, seed, cache_dir, steps)
    trainer = Trainer(cfg, overlap="none", out_dir=None, resume=False)
    meta = {"kl_coef": cfg.ppo.kl_coef, "actor_lr": cfg.ppo.actor_lr,
            "gameable": cfg.fault.at_step if cfg.fault.kind == "gameable_reward" else "", "seed": seed}
    traces: list[dict] = []
    prompts: list[dict] = []

    def checkpoint(step: int, train: dict, gate_s: float, records) -> None:
        t = time.perf_counter()
        pool = [r for b in (1, 2) for r in trainer.score_batch(b).records]
        pool_s = time.perf_counter() - t
        for r in list(records) + pool:
            prompts.append({"run_id": rid, "step": step, "prompt_id": r.prompt_id, "gold_score": r.gold_score,
                            "seed": r.seed, "proxy_score": r.proxy_score, "response_len": r.response_len})
        golds = [r.gold_score for r in records]
        mean = sum(golds) / len(golds)
        se = math.sqrt(sum((g - mean) ** 2 for g in golds) / (len(golds) - 1) / len(golds))
        traces.append({"run_id": rid, "step": step, "eval_score": mean, "eval_se": se, "gate_s": gate_s,
                       "pool_s": pool_s, **train})

    t = time.perf_counter()
    ev0 = trainer.gate()  # step 0: the base policy, scored like every later gate
    nan = {"reward": "", "loss": "", "kl": "", "entropy": "", "grad_norm": "", "response_len": ""}
    checkpoint(0, {**nan, **meta}, time.perf_counter() - t, ev0.records)
    for rec in trainer.run(steps):
        if math.isnan(rec.gold_eval):
            continue
        train = {"reward": rec.reward_mean, "loss": rec.loss_policy, "kl": rec.kl, "entropy": rec.entropy,
                 "grad_norm": rec.grad_norm, "response_len": rec.response_len_mean, **meta}
        checkpoint(rec.step, train, rec.phase_seconds["eval"], trainer.gate_records[rec.step])
    _write(_file(work, rid, "prompts"), PROMPT_COLUMNS, prompts)
    _write(_file(work, rid, "trace"), TRACE_COLUMNS, traces)  # last: marks the run done
    return time.perf_counter() - t0


def _seed_task(runs: list[tuple[str, dict, int]], work: str, cache_dir: str, deadline: float, steps: int) -> list:
    """One process: a seed's runs in order, none started after `deadline` (epoch seconds)."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.path.insert(0, str(REPO))
    import torch

    torch.set_num_threads(1)
    out = []
    for rid, over, seed in runs:
        if _file(Path(work), rid, "trace").exists():
            continue
        if time.time() > deadline:
            out.append((rid, None))
            continue
        t0, c0 = time.perf_counter(), time.process_time()
        train_one(rid, over, seed, Path(work), Path(cache_dir), steps)
        out.append((rid, (time.perf_counter() - t0, time.process_time() - c0)))
    return out


def record(runs, work: Path, cache_dir: Path, workers: int, deadline_s: float, steps: int = STEPS,
           per_run: bool = False) -> int:
    """Train the runs not yet in `work` on a process pool: one task per seed (its warm start built once), or with
    `per_run` one task per run, the gameable-proxy variants first (for a second call whose warm starts exist)."""
    work.mkdir(parents=True, exist_ok=True)
    by_seed: dict[int, list] = {}
    if per_run:
        todo = [r for r in runs if not _file(work, r[0], "trace").exists()]
        todo.sort(key=lambda r: "/game" not in r[0])
        by_seed = {i: [r] for i, r in enumerate(todo)}
    else:
        for r in runs:
            by_seed.setdefault(r[2], []).append(r)
    deadline = time.time() + deadline_s
    done = left = 0
    with ProcessPoolExecutor(max_workers=workers) as pool:
        futs = [pool.submit(_seed_task, rs, str(work), str(cache_dir), deadline, steps) for rs in by_seed.values()]
        for fut in as_completed(futs):
            for rid, timing in fut.result():
                if timing is None:
                    left += 1
                    print(f"{rid}: not started (deadline)", flush=True)
                else:
                    done += 1
                    print(f"{rid}: {timing[0]:.1f} s wall, {timing[1]:.1f} s CPU", flush=True)
    print(f"{done} runs recorded, {left} left for another call", flush=True)
    return 0


def _concat(paths: list[Path], out: Path, gz: bool) -> int:
    out.parent.mkdir(parents=True, exist_ok=True)
    n = 0
    opener = gzip.open if gz else open
    with opener(out, "wt", newline="") as f:
        for i, p in enumerate(paths):
            lines = p.read_text().splitlines(keepends=True)
            f.writelines(lines if i == 0 else lines[1:])
            n += len(lines) - 1
    return n


def plan(part: str | None = None, seeds: tuple[int, ...] | None = None,
         half: str = "all") -> list[tuple[str, dict, int]]:
    """The runs to record, in order: the declared part's seeds (None: the first corpus, tune and report), or the
    subset `seeds` of them, with the variants of `half` (a: the first five, b: the last five, all)."""
    declared = PARTS[part][0] if part else TUNE_SEEDS + REPORT_SEEDS
    if seeds is None:
        seeds = declared
    elif not set(seeds) <= set(declared):
        bad = sorted(set(seeds) - set(declared))
        where = f"the {part} part's" if part else "the first corpus's"
        raise ValueError(f"seeds: {bad} are not {where} declared seeds ({declared[0]}-{declared[-1]})")
    names = {"a": [n for n, _ in VARIANTS[:5]], "b": [n for n, _ in VARIANTS[5:]],
             "all": [n for n, _ in VARIANTS]}[half]
    return [r for r in grid(seeds) if r[0].split("/")[1] in names]


def assemble(work: Path, parts: tuple[str, ...] = ("tune", "report")) -> int:
    for part in parts:
        seeds, dest = PARTS[part]
        runs = grid(seeds)
        have = [rid for rid, _, _ in runs if _file(work, rid, "trace").exists()]
        if not have:
            continue
        n_t = _concat([_file(work, r, "trace") for r in have], dest / "traces.csv", gz=False)
        n_p = _concat([_file(work, r, "prompts") for r in have], dest / "prompts.csv.gz", gz=True)
        print(f"{part}: {len(have)} of {len(runs)} runs -> {dest.relative_to(REPO)} ({n_t} checkpoint rows, "
              f"{n_p} prompt rows)")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--list", action="store_true", help="print the declared runs and exit")
    ap.add_argument("--half", choices=("a", "b", "all"), default="all", help="variants 1-5 (a), 6-10 (b) or all")
    ap.add_argument("--part", choices=tuple(PARTS), help="one declared part (fresh: DECLARATION-fresh.md, seeds "
                    "72-91, assembled sealed); default: the first corpus (tune and report)")
    ap.add_argument("--seeds", help="comma-separated subset of the declared seeds (default: all)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--work", type=Path, default=REPO / "runs" / "prompts-work")
    ap.add_argument("--cache", type=Path, default=REPO / "runs" / ".cache-prompts")
    ap.add_argument("--deadline", type=float, default=1e9, help="start no run after this many seconds")
    ap.add_argument("--steps", type=int, default=STEPS, help="a shorter run for a smoke test (not the corpus)")
    ap.add_argument("--per-run", action="store_true", help="one pool task per run (warm starts already cached)")
    ap.add_argument("--assemble", action="store_true")
    args = ap.parse_args(argv)
    if args.assemble:
        return assemble(args.work, (args.part,) if args.part else ("tune", "report"))
    seeds = None
    if args.seeds:
        try:
            seeds = tuple(int(s) for s in args.seeds.split(","))
        except ValueError:
            raise SystemExit(f"error: --seeds: '{args.seeds}' is not a comma-separated list of integers") from None
    try:
        runs = plan(args.part, seeds, args.half)
    except ValueError as err:
        raise SystemExit(f"error: --{err} (give --part for another declared part)") from None
    if args.list:
        for i, (rid, _, seed) in enumerate(runs):
            print(i, rid, part_of(seed), "done" if _file(args.work, rid, "trace").exists() else "")
        return 0
    return record(runs, args.work, args.cache, args.workers, args.deadline, args.steps, args.per_run)


if __name__ == "__main__":
    raise SystemExit(main())
