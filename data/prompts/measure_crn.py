"""What common random numbers buy the gate: SE of a checkpoint's mean vs SE of the paired per-prompt difference of
consecutive checkpoints, on one run.

    python data/prompts/measure_crn.py [--config configs/ppo-tiny.yaml] [--steps 40] [--every 5] [--prompts 64]

Trains the config with a gate every `--every` steps on `--prompts` held-out prompts (training/gate.py: one sampling
seed per batch, fixed for the run) and, at every gate, scores the same checkpoint once more under another seed.
Prints per gate: the gate's mean and its SE; the paired difference to the previous gate (same prompts, same seed):
mean, SE and the per-prompt correlation; the same checkpoint under the other seed: the move of its mean and the SD
of the per-prompt differences between the two seeds (what pairing across checkpoints scored with a new seed each
time, as the gate did before, would have to live with). Writes nothing.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(REPO / "configs" / "ppo-tiny.yaml"))
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--every", type=int, default=5)
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--seed", type=int, default=None, help="the run's seed (default: the config's)")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(REPO))
    from training.gate import batch_seed
    from training.job.config import load_config
    from training.trainer import Trainer, gold_eval

    over = {"steps": args.steps, "eval_every": args.every, "eval_prompts": args.prompts,
            "checkpoint_every": 10_000}
    if args.seed is not None:
        over["seed"] = args.seed
    cfg = load_config(args.config).model_copy(update=over)
    trainer = Trainer(cfg, overlap="none", out_dir=None, resume=False)
    other_seed = batch_seed(cfg.seed, 0) + 7_777_777
    prev = None
    print("step  mean    SE(mean)  | paired d vs prev: mean    SE      corr  | other seed: mean move  SD(per prompt)")
    for rec in trainer.run(args.steps):
        if math.isnan(rec.gold_eval):
            continue
        y = np.array([r.gold_score for r in trainer.gate_records[rec.step]])
        alt = gold_eval(trainer.actor, trainer.inputs.heldout_prompts(range(args.prompts)), cfg, tok=trainer.tok,
                        seed=other_seed)
        ya = np.array([r.gold_score for r in alt.records])
        se = y.std(ddof=1) / math.sqrt(len(y))
        line = f"{rec.step:4d}  {y.mean():+.3f}  {se:.3f}     |"
        if prev is not None:
            d = y - prev
            corr = float(np.corrcoef(y, prev)[0, 1]) if y.std() > 0 and prev.std() > 0 else math.nan
            line += f"                  {d.mean():+.3f}  {d.std(ddof=1) / math.sqrt(len(d)):.3f}  {corr:.2f}  |"
        else:
            line += " " * 41 + "|"
        line += f"             {ya.mean() - y.mean():+.3f}      {(ya - y).std(ddof=1):.2f}"
        print(line, flush=True)
        prev = y
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
