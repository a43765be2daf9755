"""Regenerate `data/curves/own_ppo/traces.csv`: real PPO runs of this project's own trainer (training/).

A fixed grid of variants (KL coefficient, actor learning rate, a gameable proxy reward) times seeds, each
trained with `overlap="none"` on one torch thread, the held-out gold score (and its standard error) measured
at step 0 (the SFT policy) and every `EVAL_EVERY` steps. Runs are not labelled here: `build_index.py`
applies the hindsight rule of LABELS.md to every run of every source.

    .venv/bin/python data/curves/build_own_runs.py --list             # the grid, one run per line
    nice .venv/bin/python data/curves/build_own_runs.py --runs 0-9    # train runs 0..9 (skips finished ones)
    .venv/bin/python data/curves/build_own_runs.py --assemble         # merge finished runs into the CSV
    ... --fresh                                                       # the same for the held-out fresh set
    ... --holdout                                                     # ... and for the held-out set of v6
    ... --gate128                                                     # ... and for 40 holdout runs, 2x gate
    ... --gate256                                                     # ... and for the 4x-gate set (+ its twin)
    ... --sealed                                                      # ... and for v7's unseen check (+ its twin)
    ... --sealed8                                                     # ... and for v8's

Each run writes `runs/corpus-own/<run>.csv` when it finishes, so chunks can run in separate processes and a
killed chunk resumes where it stopped. Everything is seeded (prompts, warm starts, sampling, PPO), so the same
grid on the same torch build gives the same numbers.
"""

from __future__ import annotations

import argparse
import copy
import csv
import math
import sys
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
BASE_CONFIG = REPO / "configs" / "ppo-healthy.yaml"
WORK_DIR = REPO / "runs" / "corpus-own"
OUT_CSV = REPO / "data" / "curves" / "own_ppo" / "traces.csv"
STEPS = 100
EVAL_EVERY = 5
SEEDS = (0, 1, 2, 3)
#: `--fresh`: the same grid on seeds that did not exist when the default detector was chosen and calibrated; written
#: to a source of its own (`own_ppo_fresh`), held out whole (split `fresh`, see eval/corpus.py)
FRESH_SEEDS = (4, 5, 6, 7)
FRESH_CSV = REPO / "data" / "curves" / "own_ppo_fresh" / "traces.csv"
#: `--holdout`: declared before `noisepatience` v6 was chosen, read by no detector before v6 was committed: the grid
#: on seeds 8-11, plus the two gameable-proxy variants on seeds 12-19 (hacking runs are what a useful-recall figure
#: is short of); a source of its own (`own_ppo_holdout`), held out whole (split `holdout`)
HOLDOUT_SEEDS = (8, 9, 10, 11)
HOLDOUT_EXTRA_SEEDS = tuple(range(12, 20))
HOLDOUT_CSV = REPO / "data" / "curves" / "own_ppo_holdout" / "traces.csv"
#: `--gate128`: 40 of the holdout's runs (every gameable-proxy run, the plain variants on seeds 8-9) with a gate twice
#: as large (128 held-out prompts instead of 64). The gate draws its own sampling generator, so training is the same
#: run as in the holdout and only the eval's noise differs: a paired check of what a bigger gate buys the detector.
GATE128_PROMPTS = 128
GATE128_CSV = REPO / "data" / "curves" / "own_ppo_gate128" / "traces.csv"
#: `--gate256`: declared after `noisepatience` v6 was committed and before any of its runs was trained: the grid on
#: seeds 20-23 plus the two gameable-proxy variants on seeds 24-31 (the holdout's shape on seeds no set has used),
#: each run's gate scoring 256 held-out prompts (SE about half the 64-prompt gate's). Every checkpoint is also scored
#: by a second, 64-prompt gate (the first 64 held-out prompts, its own sampling seed): the same runs at the shipped
#: gate size (`own_ppo_twin64`). v6 is checked on both unchanged; neither is tuned on.
GATE256_SEEDS = (20, 21, 22, 23)
GATE256_EXTRA_SEEDS = tuple(range(24, 32))
GATE256_PROMPTS = 256
TWIN_PROMPTS = 64
#: the twin gate's sampling seed at step s is TWIN_SEED_OFFSET + s (the trainer's own gate uses s)
TWIN_SEED_OFFSET = 1_000_003
GATE256_CSV = REPO / "data" / "curves" / "own_ppo_gate256" / "traces.csv"
TWIN64_CSV = REPO / "data" / "curves" / "own_ppo_twin64" / "traces.csv"
#: `--sealed`: the `--gate256` design on seeds 32-43, declared before any detector version after v6 and kept out of
#: data/curves (in data/sealed/, read by no report or detector) until v7 was committed: v7's unseen check
SEALED_SEEDS = (32, 33, 34, 35)
SEALED_EXTRA_SEEDS = tuple(range(36, 44))
SEALED_CSV = REPO / "data" / "curves" / "own_ppo_sealed256" / "traces.csv"
SEALED_TWIN_CSV = REPO / "data" / "curves" / "own_ppo_sealed64" / "traces.csv"
#: `--sealed8`: the same two-gate design on seeds 44-55, declared after v7's unseen check was read and before any
#: later version was chosen; kept in data/sealed/ (read by no report or detector) until v8 was committed: its check
SEALED8_SEEDS = (44, 45, 46, 47)
SEALED8_EXTRA_SEEDS = tuple(range(48, 56))
SEALED8_CSV = REPO / "data" / "curves" / "own_ppo_sealed8_256" / "traces.csv"
SEALED8_TWIN_CSV = REPO / "data" / "curves" / "own_ppo_sealed8_64" / "traces.csv"
#: run-id prefix of a two-gate run -> the prefix its 64-prompt twin records; a two-gate set's CSV -> its twin's CSV
TWIN_PREFIXES = {"own-gate256/": "own-twin64/", "own-sealed256/": "own-sealed64/",
                 "own-sealed8-256/": "own-sealed8-64/"}
TWIN_CSVS = {GATE256_CSV: TWIN64_CSV, SEALED_CSV: SEALED_TWIN_CSV, SEALED8_CSV: SEALED8_TWIN_CSV}

#: (name, overrides on configs/ppo-healthy.yaml). Spans strong to weak KL, small to large learning rates and a
#: proxy with a trigger-character bonus the gold scorer ignores (switched on part-way through training).
VARIANTS: tuple[tuple[str, dict], ...] = (
    ("kl0.2-lr3e-4", {"ppo": {"kl_coef": 0.2, "actor_lr": 3e-4}}),
    ("kl0.1-lr3e-4", {"ppo": {"kl_coef": 0.1, "actor_lr": 3e-4}}),
    ("kl0.05-lr3e-4", {"ppo": {"kl_coef": 0.05, "actor_lr": 3e-4}}),
    ("kl0.02-lr3e-4", {"ppo": {"kl_coef": 0.02, "actor_lr": 3e-4}}),
    ("kl0.05-lr1e-4", {"ppo": {"kl_coef": 0.05, "actor_lr": 1e-4}}),
    ("kl0.01-lr1e-4", {"ppo": {"kl_coef": 0.01, "actor_lr": 1e-4}}),
    ("kl0.2-lr1e-3", {"ppo": {"kl_coef": 0.2, "actor_lr": 1e-3}}),
    ("kl0.01-lr1e-3", {"ppo": {"kl_coef": 0.01, "actor_lr": 1e-3}}),
    ("game40-kl0.05-lr3e-4", {"ppo": {"kl_coef": 0.05, "actor_lr": 3e-4},
                              "fault": {"kind": "gameable_reward", "at_step": 40, "bonus": 0.5}}),
    ("game40-kl0.2-lr3e-4", {"ppo": {"kl_coef": 0.2, "actor_lr": 3e-4},
                             "fault": {"kind": "gameable_reward", "at_step": 40, "bonus": 0.5}}),
)

COLUMNS = ("run_id", "step", "eval_score", "eval_se", "reward", "loss", "kl", "entropy", "grad_norm",
           "response_len", "kl_coef", "actor_lr", "gameable", "seed")


def _grid_plus_gameable(prefix: str, seeds, extra_seeds, over: dict | None = None) -> list[tuple[str, dict, int]]:
    """Every variant on `seeds`, then the gameable-proxy variants on `extra_seeds`, each with `over` applied."""
    runs = [(f"{prefix}/{name}/seed{seed}", {**overrides, **(over or {})}, seed)
            for name, overrides in VARIANTS for seed in seeds]
    return runs + [(f"{prefix}/{name}/seed{seed}", {**overrides, **(over or {})}, seed)
                   for name, overrides in VARIANTS if name.startswith("game") for seed in extra_seeds]


def grid(fresh: bool = False, holdout: bool = False, gate128: bool = False, gate256: bool = False,
         sealed: bool = False, sealed8: bool = False) -> list[tuple[str, dict, int]]:
    """Every run of the corpus (`fresh`, `holdout`, `gate128`, `gate256`, `sealed`, `sealed8`: of that held-out
    set): (run_id, override dict, seed), in a fixed order."""
    if gate256 or sealed or sealed8:
        bigger = {"eval_prompts": GATE256_PROMPTS, "task": {"n_heldout_prompts": GATE256_PROMPTS}}
        if sealed8:
            return _grid_plus_gameable("own-sealed8-256", SEALED8_SEEDS, SEALED8_EXTRA_SEEDS, bigger)
        if sealed:
            return _grid_plus_gameable("own-sealed256", SEALED_SEEDS, SEALED_EXTRA_SEEDS, bigger)
        return _grid_plus_gameable("own-gate256", GATE256_SEEDS, GATE256_EXTRA_SEEDS, bigger)
    if gate128:
        return [(run_id.replace("own-holdout/", "own-gate128/"), {**overrides, "eval_prompts": GATE128_PROMPTS}, seed)
                for run_id, overrides, seed in grid(holdout=True)
                if "/game" in run_id or seed in HOLDOUT_SEEDS[:2]]
    if holdout:
        return _grid_plus_gameable("own-holdout", HOLDOUT_SEEDS, HOLDOUT_EXTRA_SEEDS)
    prefix, seeds = ("own-fresh", FRESH_SEEDS) if fresh else ("own", SEEDS)
    return [(f"{prefix}/{name}/seed{seed}", overrides, seed) for name, overrides in VARIANTS for seed in seeds]


def _merge(base: dict, over: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in over.items():
        out[key] = _merge(out.get(key, {}), value) if isinstance(value, dict) else value
    return out


def run_config(overrides: dict, seed: int):
    from training.job.config import TrainConfig

    raw = yaml.safe_load(BASE_CONFIG.read_text())
    raw = _merge(raw, {"name": "corpus-own", "seed": seed, "steps": STEPS, "eval_every": EVAL_EVERY,
                       "checkpoint_every": 10_000, "oppo": {"torch_threads": 1},
                       "cache_dir": str(REPO / "runs" / ".cache-corpus")})
    return TrainConfig.model_validate(_merge(raw, overrides))


def twin_id(run_id: str) -> str | None:
    """The run id of a two-gate run (`gate256`, `sealed`, `sealed8`) as its 64-prompt twin gate records it; None
    for others."""
    for prefix, twin in TWIN_PREFIXES.items():
        if run_id.startswith(prefix):
            return twin + run_id[len(prefix):]
    return None


def train_one(run_id: str, overrides: dict, seed: int) -> tuple[list[dict], list[dict]]:
    """One run's rows, and (for a two-gate run) the rows of its 64-prompt twin gate, else []. The twin scores the
    live policy right after the trainer's own gate, with its own sampling generator, so training is untouched."""
    from training.trainer import Trainer, gold_eval

    cfg = run_config(overrides, seed)
    trainer = Trainer(cfg, overlap="none", out_dir=None, resume=False)
    meta = {"kl_coef": cfg.ppo.kl_coef, "actor_lr": cfg.ppo.actor_lr,
            "gameable": cfg.fault.at_step if cfg.fault.kind == "gameable_reward" else "", "seed": seed}
    twin = twin_id(run_id) is not None
    heldout = trainer.inputs.heldout_prompts(range(trainer.inputs.n_heldout))

    def twin_row(step: int, train: dict) -> dict:
        ev = gold_eval(trainer.actor, heldout[:TWIN_PROMPTS], cfg, tok=trainer.tok, seed=TWIN_SEED_OFFSET + step)
        return {**train, "run_id": twin_id(run_id), "step": step, "eval_score": ev.mean, "eval_se": ev.se}

    ev0 = gold_eval(trainer.actor, heldout[: cfg.eval_prompts], cfg, tok=trainer.tok, seed=0)
    rows = [{"run_id": run_id, "step": 0, "eval_score": ev0.mean, "eval_se": ev0.se, **meta}]
    twins = [twin_row(0, meta)] if twin else []
    for rec in trainer.run(STEPS):
        if math.isnan(rec.gold_eval):
            continue
        train = {"reward": rec.reward_mean, "loss": rec.loss_policy, "kl": rec.kl, "entropy": rec.entropy,
                 "grad_norm": rec.grad_norm, "response_len": rec.response_len_mean, **meta}
        rows.append({"run_id": run_id, "step": rec.step, "eval_score": rec.gold_eval, "eval_se": rec.gold_eval_se,
                     **train})
        if twin:
            twins.append(twin_row(rec.step, train))
    return rows, twins


def _run_file(run_id: str) -> Path:
    return WORK_DIR / (run_id.replace("/", "__") + ".csv")


def _write(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with tmp.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        for r in rows:
            w.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in r.items()})
    tmp.replace(path)


def _parse_range(spec: str, n: int) -> list[int]:
    out: list[int] = []
    for part in spec.split(","):
        lo, _, hi = part.partition("-")
        try:
            a, b = int(lo), int(hi or lo)
        except ValueError:
            raise SystemExit(f"error: --runs '{spec}': expected indices like 0-9,12 (see --list)") from None
        if not 0 <= a <= b < n:
            raise SystemExit(f"error: --runs '{spec}': indices must lie in 0..{n - 1} (see --list)")
        out.extend(range(a, b + 1))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--list", action="store_true", help="print the grid and exit")
    ap.add_argument("--runs", help="indices of the grid to train, e.g. 0-9,12 (default: all)")
    ap.add_argument("--assemble", action="store_true", help=f"merge finished runs into {OUT_CSV.relative_to(REPO)}")
    ap.add_argument("--partial", action="store_true", help="with --assemble: merge the finished runs only")
    sets = ap.add_mutually_exclusive_group()  # each flag names another set of runs
    sets.add_argument("--fresh", action="store_true",
                    help=f"the held-out fresh set (seeds {FRESH_SEEDS}) instead of the corpus grid")
    sets.add_argument("--holdout", action="store_true",
                    help=f"the held-out set of noisepatience v6 (seeds {HOLDOUT_SEEDS[0]}-{HOLDOUT_EXTRA_SEEDS[-1]})")
    sets.add_argument("--gate128", action="store_true",
                    help=f"40 of the holdout's runs with a {GATE128_PROMPTS}-prompt gate (a paired check of gate size)")
    sets.add_argument("--gate256", action="store_true",
                    help=f"the {GATE256_PROMPTS}-prompt-gate set (seeds {GATE256_SEEDS[0]}-{GATE256_EXTRA_SEEDS[-1]}) "
                         f"and its {TWIN_PROMPTS}-prompt twin gate")
    sets.add_argument("--sealed", action="store_true",
                    help=f"the two-gate set sealed until v7 (seeds {SEALED_SEEDS[0]}-{SEALED_EXTRA_SEEDS[-1]}) "
                         f"and its {TWIN_PROMPTS}-prompt twin gate")
    sets.add_argument("--sealed8", action="store_true",
                    help=f"the two-gate set sealed until v8 (seeds {SEALED8_SEEDS[0]}-{SEALED8_EXTRA_SEEDS[-1]}), "
                         f"written to {SEALED8_CSV.parent.parent.relative_to(REPO)}/")
    args = ap.parse_args(argv)
    runs = grid(args.fresh, args.holdout, args.gate128, args.gate256, args.sealed, args.sealed8)
    out_csv = (SEALED8_CSV if args.sealed8 else SEALED_CSV if args.sealed else GATE256_CSV if args.gate256
               else GATE128_CSV if args.gate128 else HOLDOUT_CSV if args.holdout else FRESH_CSV if args.fresh
               else OUT_CSV)
    if args.list:
        for i, (run_id, _, _) in enumerate(runs):
            print(i, run_id, "done" if _run_file(run_id).exists() else "")
        return 0
    if args.assemble:
        missing = [r for r, _, _ in runs if not _run_file(r).exists()]
        if args.partial:
            runs = [r for r in runs if _run_file(r[0]).exists()]
        elif missing:
            print(f"error: {len(missing)} runs not trained yet (first: {missing[0]}); train them with --runs",
                  file=sys.stderr)
            return 2
        outputs = [(out_csv, [r for r, _, _ in runs])]
        if out_csv in TWIN_CSVS:
            outputs.append((TWIN_CSVS[out_csv], [twin_id(r) for r, _, _ in runs]))
        left = f" ({len(missing)} not trained yet)" if missing else ""
        for csv_path, run_ids in outputs:
            csv_path.parent.mkdir(parents=True, exist_ok=True)
            with csv_path.open("w", newline="") as out:
                out.write(",".join(COLUMNS) + "\n")
                for run_id in run_ids:
                    out.writelines(_run_file(run_id).read_text().splitlines(keepends=True)[1:])
            print(f"{len(run_ids)} runs -> {csv_path.relative_to(REPO)}{left}")
        return 0
    todo = _parse_range(args.runs, len(runs)) if args.runs else list(range(len(runs)))
    sys.path.insert(0, str(REPO))
    for i in todo:
        run_id, overrides, seed = runs[i]
        path = _run_file(run_id)
        if path.exists():
            continue
        t0, c0 = time.perf_counter(), time.process_time()
        rows, twins = train_one(run_id, overrides, seed)
        if twins:
            _write(_run_file(twin_id(run_id)), twins)  # before the run's own file, which marks the run done
        _write(path, rows)
        print(f"{i} {run_id}: {len(rows)} checkpoints, {time.perf_counter() - t0:.1f} s wall, "
              f"{time.process_time() - c0:.1f} s CPU", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
