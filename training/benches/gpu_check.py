"""The one-command GPU check (`scripts/gpu-check`): what the trainer does on one GPU, in at most 8 minutes.

Writes `gpu-check.json` (keys: docs/oppo.md "GPU check") to the folder it is given, rewritten after every part so a
timeout still leaves what was measured. Each part is bounded by the budget (`--budget-s`, default 450 s):
- `small_shape` first (30% of the budget): configs/ppo-tiny.yaml's models with the real shape's length tail scaled
  to a 128-token cap (lognormal, the same share at the cap); two calibration steps of the sequential mode size the
  run (up to 30 steps) to its share; then the four modes round-robin through `training.benches.oppo.bench_oppo` (one
  seed), with GRPO's sequential and full runs beside them (modes `grpo/none`, `grpo/full`: G=4, no critic, against
  sequential PPO's target): time to held-out gold, final held-out gold and its SE over prompts, the gold speedups;
- `real_shape` (the rest): configs/ppo-qwen2-0.5b.yaml. The warm starts (tokenizer, base policy, proxy reward
  model, cached in a temporary folder), the decode latency of the project's engine against the number of active
  rows (after a 512-token prefill, as the anchor), then per mode (sequential first, full overlap next: the pair the
  step speedup needs) `warmup` steps (inter-step overlap's first step starts with no carried responses, so inter
  and full get one) and `--steps` measured steps (default 1: a sequential step at this shape is about a minute),
  each started only while the budget has room for a step as long as the last one: step time, its phases, tokens
  generated per second, peak GPU memory. Modes run one after another, each with its own trainer (a dedicated GPU
  needs no interleaving, and each mode's peak memory is its own).

- `nccl_world1` (between them, seconds): the gradient all-reduce on a one-rank process group (NCCL on cuda).

`--dry --device cpu`: tiny shapes, one or two steps per mode, seconds; CI runs it (tests/training/test_gpu_check.py).
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
REAL_CONFIG = REPO / "configs" / "ppo-qwen2-0.5b.yaml"
SMALL_CONFIG = REPO / "configs" / "ppo-tiny.yaml"
MODE_ORDER = ("none", "full", "inter", "intra")
#: the small shape: ppo-tiny's models and byte tokens; the real shape's tail (lognormal, sigma 0.9, median 211 of a
#: 1024-token cap, 3.3% at the cap) scaled by 1/8 to a 128 cap (median 26 bytes: mean 38), so a step takes a second
SMALL_OVERRIDES = {"ppo.max_new_tokens": 128, "task.length_dist": "lognormal", "task.length_sigma": 0.9,
                   "task.short_mean_len": 38.0, "task.long_mean_len": 38.0}
DRY_SHAPE = {"arch": "qwen2", "hidden_size": 32, "num_layers": 1, "num_heads": 4, "num_kv_heads": 2,
             "intermediate_size": 64}
DRY_REAL = {"policy": DRY_SHAPE, "reward": DRY_SHAPE, "task.tokenizer": "byte", "task.sft_steps": 3,
            "task.n_pairs": 32, "task.rm_epochs": 1, "task.n_train_prompts": 64, "task.n_heldout_prompts": 16,
            "task.prompt_words": 2, "ppo.batch_size": 4, "ppo.max_new_tokens": 12, "ppo.num_mini_batches": 1,
            "ppo.num_ppo_epochs": 1, "oppo.delta_init": 2, "oppo.delta_max": 4, "eval_prompts": 8}
DRY_SMALL = {"task.sft_steps": 3, "task.n_pairs": 32, "task.rm_epochs": 1, "task.n_train_prompts": 64,
             "task.n_heldout_prompts": 16, "ppo.batch_size": 4, "ppo.max_new_tokens": 12, "ppo.num_ppo_epochs": 1,
             "ppo.num_mini_batches": 1, "eval_prompts": 8, "task.short_mean_len": 10.0, "task.long_mean_len": 10.0}
DECODE_ROWS = (1, 2, 4, 8, 16, 32, 64, 128)


class Check:
    """The JSON being filled in, written out after every part."""

    def __init__(self, out: Path, budget_s: float):
        self.path = out / "gpu-check.json"
        self.t0 = time.perf_counter()
        self.budget_s = budget_s
        self.data: dict = {}

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def left(self) -> float:
        return self.budget_s - self.elapsed()

    def say(self, msg: str) -> None:
        print(f"[gpu-check {self.elapsed():6.1f}s] {msg}", flush=True)

    def write(self) -> None:
        self.data["elapsed_s"] = self.elapsed()
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(_finite_or_null(self.data), indent=1, allow_nan=False) + "\n")
        tmp.replace(self.path)


def _sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _peak_gib(device) -> float:
    import torch

    return torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else 0.0


def _reset_peak(device) -> None:
    import torch

    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def decode_ms_by_rows(model, pad_id: int, vocab: int, rows=DECODE_ROWS, context: int = 512, steps: int = 16,
                      warmup: int = 3) -> dict[str, float]:
    """ms per decode step of the project's engine (`TransformersEngine`, KV cache, sampling) for `rows` active rows
    after a `context`-token prefill; no row finishes (no token is the end id)."""
    import torch

    from training.rollout.engine import TransformersEngine

    device = next(model.parameters()).device
    gen = torch.Generator(device=device).manual_seed(0)
    out = {}
    for b in rows:
        engine = TransformersEngine(eos_id=-1, pad_id=pad_id, temperature=1.0)
        engine.sync(model, 0)
        ids = torch.randint(2, vocab, (b, context), device=device)
        engine.begin(ids, torch.ones_like(ids), torch.zeros(b, dtype=torch.bool, device=device),
                     torch.zeros(b, dtype=torch.long, device=device), 10**9, gen)
        engine.decode(warmup, b + 1)
        _sync(device)
        t = time.perf_counter()
        engine.decode(steps, b + 1)
        _sync(device)
        out[str(b)] = (time.perf_counter() - t) / steps * 1e3
        engine.release()
    return out


def small_shape(check: Check, device: str, dry: bool, max_steps: int, gate_every: int, budget_s: float) -> None:
    """Time to held-out gold of the four modes at the small shape, as `bench oppo` measures it; as many steps (up to
    `max_steps`) as fit `budget_s` at the step time of two calibration steps of the sequential mode."""
    from training.benches.oppo import DEFAULT_VARIANTS, bench_oppo, config_variants
    from training.job.config import resolve_config
    from training.trainer import Trainer

    over = {**SMALL_OVERRIDES, **(DRY_SMALL if dry else {}), "device": device, "dtype": "float32",
            "cache_dir": check.cache_dir}
    cfg = resolve_config(SMALL_CONFIG, over)
    # the GRPO row: the same task and batch, G completions per prompt, no critic, judged against sequential PPO's
    # target (modes "grpo/none" and "grpo/full"); Delta counts groups
    group = 2 if dry else 4
    grpo = resolve_config(SMALL_CONFIG, {**over, "algorithm": "grpo", "ppo.group_size": group,
                                         "oppo.delta_init": max(1, cfg.oppo.delta_init // group),
                                         "oppo.delta_max": max(1, cfg.oppo.delta_max // group)})
    variants = DEFAULT_VARIANTS + config_variants(grpo)
    check.say("small shape: warm starts and two calibration steps")
    t = time.perf_counter()
    probe = Trainer(cfg, "none", out_dir=None, resume=False)
    warm = time.perf_counter() - t
    t = time.perf_counter()
    for _ in range(2):
        probe.train_step()
    step_s = (time.perf_counter() - t) / 2
    del probe
    # 6 runs a step (a GRPO step costs about a PPO one: no critic, its groups as many rows), a quarter more for the
    # gates; the bench builds its trainers from the cached warm starts
    n = len(variants)
    steps = max(2, min(max_steps, int((budget_s - warm - n * warm / 10) / (n * 1.25 * step_s))))
    check.say(f"small shape: warm starts {warm:.1f} s, {step_s:.2f} s a sequential step -> {steps} steps")
    part = check.data["small_shape"] = {"config": cfg.model_dump(mode="json"), "steps": steps,
                                        "gate_every": gate_every, "calibration_step_s": step_s, "modes": {},
                                        "speedup_gold": {}}
    check.say(f"small shape: {steps} steps x {n} runs round-robin, gold gate every {gate_every}")
    t = time.perf_counter()
    res = bench_oppo(cfg, steps, smooth=min(5, steps), seeds=(cfg.seed,), gate_every=gate_every, variants=variants,
                     progress=lambda i, n: check.say(f"small shape step {i}/{n}") if i % 5 == 0 or i == n else None)
    for mode, m in res["modes"].items():
        seed_row = res["per_seed"][mode][0]
        part["modes"][mode] = {"time_to_gold_s": m["time_to_gold_s"], "final_gold_heldout": m["final_gold_heldout"],
                               "final_gold_heldout_se": seed_row["final_gold_heldout_prompt_se"],
                               "step_s": m["step_s_mean"], "steps_to_gold": m["steps_to_gold"]}
    part["speedup_gold"] = res["speedup_gold"]
    part["target_gold"] = res["per_seed"]["none"][0]["target_gold"]
    part["workload"] = res["workload"]
    part["wall_s"] = time.perf_counter() - t
    check.write()


def real_shape(check: Check, device: str, dtype: str, dry: bool, steps: int, engine: str | None) -> None:
    import torch

    from training.benches.oppo import PHASE_KEYS
    from training.job.config import resolve_config
    from training.trainer import Trainer

    over = {**(DRY_REAL if dry else {}), "device": device, "dtype": dtype, "cache_dir": check.cache_dir}
    if engine:
        over["engine"] = engine
    cfg = resolve_config(REAL_CONFIG, over)
    part = check.data["real_shape"] = {"config": cfg.model_dump(mode="json"), "decode_ms_by_rows": {}, "modes": {},
                                       "step_speedup": {}}
    check.say("real shape: tokenizer and warm starts (cached for the four modes)")
    t = time.perf_counter()
    trainer = Trainer(cfg, "none", out_dir=None, resume=False, progress=check.say)
    part["warm_start_s"] = time.perf_counter() - t
    dev = next(trainer.actor.parameters()).device
    check.say(f"warm starts {part['warm_start_s']:.1f} s on {dev}; decode latency against active rows")
    rows = (1, 2, 4) if dry else DECODE_ROWS
    part["decode_ms_by_rows"] = decode_ms_by_rows(trainer.actor, trainer.tok.pad_id, trainer.tok.vocab_size, rows,
                                                  context=16 if dry else 512, steps=2 if dry else 16,
                                                  warmup=1 if dry else 3)
    check.say("decode ms: " + ", ".join(f"{b}: {v:.1f}" for b, v in part["decode_ms_by_rows"].items()))
    check.write()
    last_step = 0.0
    for mode in MODE_ORDER:
        if trainer is None:
            _reset_peak(dev)
            trainer = Trainer(cfg, mode, out_dir=None, resume=False)
        else:
            _reset_peak(dev)
        warmup = 1 if mode in ("inter", "full") else 0
        rec_steps, times, phases, tokens = 0, [], {k: 0.0 for k in PHASE_KEYS}, 0
        for i in range(warmup + steps):
            if i > 0 and check.left() < 1.2 * last_step:
                check.say(f"{mode}: budget spent after {rec_steps} measured steps")
                break
            if i == 0 and check.left() < 0.6 * last_step:
                check.say(f"{mode}: skipped, {check.left():.0f} s of budget left")
                break
            _sync(dev)
            t = time.perf_counter()
            rec = trainer.train_step()
            _sync(dev)
            last_step = time.perf_counter() - t
            check.say(f"{mode} step {i + 1}{' (warm-up)' if i < warmup else ''}: {last_step:.2f} s, "
                      f"{rec.tokens_generated} tokens generated")
            if i < warmup:
                continue
            rec_steps += 1
            times.append(last_step)
            tokens += rec.tokens_generated
            for k in phases:
                phases[k] += float(rec.phase_seconds.get(k, 0.0))
        if times:
            step_s = sum(times) / len(times)
            part["modes"][mode] = {"step_s": step_s, "steps": rec_steps, "warmup_steps": warmup,
                                   "phases_s": {k: v / rec_steps for k, v in phases.items()},
                                   "tokens_per_s": tokens / sum(times), "peak_gpu_mem_gib": _peak_gib(dev)}
        ref = part["modes"].get("none")
        part["step_speedup"] = {m: ref["step_s"] / v["step_s"] for m, v in part["modes"].items()} if ref else {}
        check.write()
        del trainer
        trainer = None
    del trainer
    _reset_peak(torch.device(dev))


def nccl_world1(check: Check, device: str, dry: bool, repeats: int = 5) -> None:
    """`nccl_world1`: the gradient all-reduce of a job on ranks (`World.reduce_grads`) on a real process group of one
    rank, as `World.connect` makes it: NCCL on `cuda`, gloo on the CPU dry run. A flat buffer the size of the real
    shape's policy gradients (float32; the dry run's tiny shape), all-reduced `repeats` times after one warm-up: its
    median time and bandwidth, and that the sum over one rank is the input. Two NCCL ranks cannot share one GPU
    ("Duplicate GPU detected"), so the multi-GPU figure is the next check, on a machine of several (docs/ranks.md)."""
    import socket
    import statistics

    import torch

    from training.distributed.world import World
    from training.job.config import resolve_config
    from training.job.sizing import max_positions, parameter_count, vocab_size

    cfg = resolve_config(REAL_CONFIG, {"policy": DRY_SHAPE} if dry else {})
    numel = parameter_count(cfg.policy, max_positions(cfg), vocab_size(cfg.task))
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    world = World.connect(0, 1, "127.0.0.1", port, device, timeout_s=120)
    dev = torch.device(device)
    flat = torch.arange(numel, dtype=torch.float32, device=dev) % 1024
    want = flat.clone()
    world.grad_pg.allreduce([flat]).wait()
    times = []
    for _ in range(repeats):
        _sync(dev)
        t = time.perf_counter()
        world.grad_pg.allreduce([flat]).wait()
        _sync(dev)
        times.append(time.perf_counter() - t)
    ms = 1000 * statistics.median(times)
    backend = "nccl" if dev.type == "cuda" else "gloo"
    check.data["nccl_world1"] = {
        "backend": backend, "world_size": world.size, "numel": numel, "bytes": 4 * numel, "allreduce_ms": ms,
        "allreduce_gb_per_s": 4 * numel / (ms / 1000) / 1e9, "sum_ok": bool(torch.equal(flat, want)),
        "note": "one rank: the group's set-up and a collective's fixed cost; two NCCL ranks need two GPUs"}
    check.write()
    check.say(f"{backend} world size 1: all-reduce of {4 * numel / 2**20:.0f} MiB in {ms:.1f} ms")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="gpu-check", description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="folder for gpu-check.json")
    ap.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu (default cuda)")
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"), help="the real shape's dtype")
    ap.add_argument("--engine", default=None, help="the real shape's rollout engine (default: the config's)")
    ap.add_argument("--dry", action="store_true", help="tiny shapes, one step per mode (CI, with --device cpu)")
    ap.add_argument("--budget-s", type=float, default=450.0,
                    help="seconds for the whole check; no step starts that would end past it (default 450)")
    ap.add_argument("--steps", type=int, default=None, help="measured real-shape steps per mode (default 1: a "
                    "sequential step at the 0.5B shape is about a minute)")
    ap.add_argument("--small-steps", type=int, default=None,
                    help="most small-shape steps per mode (default 30, fewer if its share of the budget, 30%%, is "
                         "short; dry 2)")
    ap.add_argument("--skip-small", action="store_true", help="only the real shape")
    args = ap.parse_args(argv)
    try:
        import pydantic
    except ImportError:
        print("gpu-check: pydantic is missing: run `make wheelhouse` on a connected machine and copy wheelhouse/ "
              "here (scripts/gpu-check installs it)", file=sys.stderr)
        return 2
    if int(pydantic.VERSION.split(".")[0]) < 2:
        print(f"gpu-check: pydantic {pydantic.VERSION} found, 2.x needed (the wheelhouse brings it)", file=sys.stderr)
        return 2
    import torch
    import transformers

    try:
        dev = torch.device(args.device)
    except RuntimeError:
        print(f"gpu-check: --device '{args.device}' is not a device (cuda, cuda:N or cpu)", file=sys.stderr)
        return 2
    if dev.type == "cuda" and not torch.cuda.is_available():
        print(f"gpu-check: --device {args.device}: torch {torch.__version__} sees no CUDA device here (use --device "
              "cpu --dry for the CPU dry run)", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    check = Check(args.out, args.budget_s)
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    check.data.update(device=name, torch=torch.__version__, transformers=transformers.__version__,
                      python=sys.version.split()[0], dry=args.dry, budget_s=args.budget_s)
    check.write()
    check.say(f"{name}, torch {torch.__version__}, transformers {transformers.__version__}")
    with tempfile.TemporaryDirectory(prefix="gpu-check-cache-") as cache:
        check.cache_dir = cache
        if not args.skip_small:
            small_steps = args.small_steps or (2 if args.dry else 30)
            small_shape(check, args.device, args.dry, small_steps, 1 if args.dry else 5, 0.3 * args.budget_s)
        nccl_world1(check, args.device, args.dry)
        real_shape(check, args.device, args.dtype, args.dry, args.steps or 1, args.engine)
    check.say(f"done: {check.path}")
    return 0


def _finite_or_null(obj):
    """The JSON with every non-finite number as null (NaN is not JSON; a NaN must not end the check mid-way)."""
    if isinstance(obj, dict):
        return {k: _finite_or_null(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite_or_null(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


if __name__ == "__main__":
    sys.exit(main())
