"""Rollout engines side by side on one machine: the chunked loop (training/rollout/engine.py), the full-batch loop
(training/rollout/continuous.py) and, optionally, transformers' continuous batching (`generate_batch`).

Part 1 (generation throughput): N prompts generated to completion, no early stop. Part 2 (inter-step overlap,
the trainer's use): rollouts that stop once B of B + Delta in-flight sequences have finished and carry the rest,
on the config's SFT'd base policy (long-tailed answer lengths), no weight updates between rollouts. Decode steps
are the GPU-relevant figure: a decode step costs about the same for 1 row or 128 there (issue 38).

    PYTHONPATH=$PWD .venv/bin/python scripts/bench-engines.py --config configs/ppo-tiny.yaml --rollouts 6 --hf-cb
    PYTHONPATH=$PWD .venv/bin/python scripts/bench-engines.py --config configs/ppo-tiny.yaml --train-steps 20
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch

from training.job.config import load_config
from training.rollout.continuous import ContinuousEngine, Entrant, continuous_rollout
from training.rollout.engine import TransformersEngine, left_pad
from training.rollout.streaming import rollout
from training.trainer import Trainer


def generation(tr: Trainer, n: int, max_new: int, slots: int, hf_cb: bool) -> dict:
    prompts = [tr.tok.encode(tr.inputs.render(tr.inputs.prompt("train", i))) for i in range(n)]
    out = {}
    eng = TransformersEngine(tr.tok.eos_id, tr.tok.pad_id)
    eng.sync(tr.actor, 0)
    t = time.perf_counter()
    ids, attn = left_pad(prompts, tr.tok.pad_id)
    eng.begin(ids, attn, torch.zeros(n, dtype=torch.bool), torch.zeros(n, dtype=torch.long), max_new,
              torch.Generator().manual_seed(1))
    chunk = eng.decode(max_new, n)
    s = time.perf_counter() - t
    toks = int(chunk.mask.sum())
    out["chunked"] = {"rows": n, "seconds": s, "tokens": toks, "tokens_per_s": toks / s,
                      "decode_steps": chunk.ids.shape[1], "forwards": chunk.ids.shape[1]}
    for k in sorted({slots, n}):
        ce = ContinuousEngine(tr.tok.eos_id, tr.tok.pad_id)
        ce.sync(tr.actor, 0)
        q = [Entrant(i, p, 0) for i, p in enumerate(prompts)]
        got: list[int] = []
        t = time.perf_counter()
        _, steps = ce.run(lambda q=q: q.pop(0) if q else None, k, max_new, torch.Generator().manual_seed(1),
                          lambda ex, got=got: got.append(len(ex.tokens)) and False)
        s = time.perf_counter() - t
        out[f"continuous_{k}_slots"] = {"rows": k, "seconds": s, "tokens": sum(got), "tokens_per_s": sum(got) / s,
                                        "decode_steps": steps, "forwards": ce.forwards}
    if hf_cb:
        from transformers import GenerationConfig

        gc = GenerationConfig(max_new_tokens=max_new, do_sample=True, temperature=1.0, eos_token_id=tr.tok.eos_id,
                              pad_token_id=tr.tok.pad_id)
        t = time.perf_counter()
        res = tr.actor.generate_batch(inputs=prompts, generation_config=gc)
        s = time.perf_counter() - t
        toks = sum(len(r.generated_tokens) for r in res.values())
        out["transformers_generate_batch"] = {"seconds": s, "tokens": toks, "tokens_per_s": toks / s}
    return out


def inter_step(tr: Trainer, rollouts: int, refill_mins: list[int]) -> dict:
    cfg = tr.cfg
    B, delta = tr.units_per_step, tr.delta_ctl.delta
    out = {}
    names = ["chunked_sequential", "chunked_inter"] + [f"continuous_inter_refill_min_{k}" for k in refill_mins]
    for name in names:
        tr.prompt_rng = np.random.default_rng([cfg.seed, 404])
        gen = torch.Generator().manual_seed(5)
        buffer = []
        rows = []
        for _ in range(rollouts):
            t = time.perf_counter()
            if name.startswith("continuous"):
                eng = ContinuousEngine(tr.tok.eos_id, tr.tok.pad_id, cfg.ppo.temperature,
                                       refill_min=int(name.rsplit("_", 1)[1]))
                eng.sync(tr.actor, 0)
                r = continuous_rollout(eng, tr.scorers, buffer, tr._new_unit, slots=B + delta, pad_id=tr.tok.pad_id,
                                       units_needed=B, max_new_tokens=cfg.ppo.max_new_tokens, generator=gen)
            else:
                want = B + (delta if name == "chunked_inter" else 0)
                while len(buffer) < want:
                    buffer += tr._new_unit()
                eng = TransformersEngine(tr.tok.eos_id, tr.tok.pad_id, cfg.ppo.temperature)
                eng.sync(tr.actor, 0)
                r = rollout(eng, tr.scorers, buffer, pad_id=tr.tok.pad_id, units_needed=B,
                            max_new_tokens=cfg.ppo.max_new_tokens, chunk_size=cfg.ppo.max_new_tokens, stream=False,
                            generator=gen)
            wall = time.perf_counter() - t
            buffer = r.deferred
            # model forwards: the chunked loop's prefill plus one per decode step after the first
            fwd = eng.forwards if name.startswith("continuous") else 1 + max(r.decode_steps - 1, 0)
            rows.append({"wall_s": wall, "forwards": fwd, "decode_s": r.decode_s, "score_s": r.score_s,
                         "decode_steps": r.decode_steps,
                         "tokens": r.tokens_generated, "trained": len(r.samples),
                         "trained_len_mean": float(np.mean([len(s.seq.response_ids) for s in r.samples]))})
        out[name] = {k: float(np.mean([x[k] for x in rows])) for k in rows[0]}
        out[name]["tokens_per_s"] = out[name]["tokens"] / out[name]["decode_s"]
    return out


def training(config: str, over: dict, steps: int) -> dict:
    """`steps` trainer steps per (inter | full) x (transformers | continuous), the gate off."""
    out = {}
    for overlap in ("inter", "full"):
        for engine in ("transformers", "continuous"):
            cfg = load_config(config, {**over, "engine": engine, "eval_every": 1_000_000})
            tr = Trainer(cfg, overlap)
            t = time.perf_counter()
            recs = list(tr.run(steps))
            wall = time.perf_counter() - t
            out[f"{overlap}_{engine}"] = {
                "s_per_step": wall / steps,
                "rollout_s": float(np.mean([r.phase_seconds["rollout"] for r in recs])),
                "decode_steps": float(np.mean([r.decode_steps for r in recs])),
                "staleness_max": max(r.staleness_max for r in recs),
                "carried_max": max(r.deferred for r in recs),
                "reward_last3": float(np.mean([r.reward_mean for r in recs[-3:]])),
            }
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default="configs/ppo-tiny.yaml")
    ap.add_argument("--cache-dir", default=None)
    ap.add_argument("--rollouts", type=int, default=6)
    ap.add_argument("--gen-prompts", type=int, default=32)
    ap.add_argument("--gen-max-new", type=int, default=128)
    ap.add_argument("--hf-cb", action="store_true", help="also time transformers' generate_batch")
    ap.add_argument("--train-steps", type=int, default=0, help="also train this many steps per overlap and engine")
    ap.add_argument("--batch-size", type=int, default=None, help="override ppo.batch_size (B)")
    ap.add_argument("--refill-min", type=int, nargs="+", default=[1], help="continuous: refill once this many free")
    ap.add_argument("--delta", type=int, default=None, help="override oppo.delta_init (and delta_max if smaller)")
    args = ap.parse_args()
    over = {"cache_dir": args.cache_dir} if args.cache_dir else {}
    if args.batch_size:
        over["ppo.batch_size"] = args.batch_size
    if args.delta is not None:
        over["oppo.delta_init"] = args.delta
        over["oppo.delta_max"] = max(args.delta, 16)
    cfg = load_config(args.config, over)
    tr = Trainer(cfg, "inter")
    torch.set_num_threads(cfg.oppo.torch_threads)
    with torch.no_grad():
        res = {"generation": generation(tr, args.gen_prompts, args.gen_max_new, args.gen_prompts // 2, args.hf_cb),
               "inter_step": inter_step(tr, args.rollouts, args.refill_min)}
    if args.train_steps:
        res["training"] = training(args.config, over, args.train_steps)
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
