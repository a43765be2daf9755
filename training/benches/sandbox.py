"""`rlhfops bench sandbox`: what the tenant-code sandbox (training/inputs/sandbox.py) costs.

- Start-up: a fresh pool's first call (spawn, the worker's imports, loading a trivial function), `runs` times per
  mode, the modes alternating: `bwrap` (the sandbox) and `none` (the operator's switch: the same pool, unsandboxed).
  Paid once per worker; the docs quote the median.
- Per step: a few PPO steps of `configs/ppo-arith.yaml` (overlap none) with its reward, the built-in
  `gsm8k:flexible_extract`, run as tenant code (a FILE.py calling the same function, so it goes through the pool),
  sandboxed and not, in alternating rounds after one warm-up step each: the step's wall time and its `reward_fn`
  phase, median and interquartile range, and the sandbox's share of the step time (goal: at most 5%).

The machine's 1-minute load average is recorded before and after: on a shared machine the spread is mostly other
people's work.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

#: the tenant-code copy of the arithmetic job's reward: the built-in, reached through the pool
ARITH_REWARD = '''from training.inputs.rewards.gsm8k import flexible_extract


def score(prompts, completions, answer, **kwargs):
    return flexible_extract(prompts, completions, answer)
'''
TRIVIAL = "def score(completions, **kwargs):\n    return [0.0] * len(completions)\n"
MODES = ("bwrap", "none")


def _spread(values: list[float]) -> dict[str, float]:
    q = statistics.quantiles(values, n=4) if len(values) > 1 else [values[0]] * 3
    return {"median": statistics.median(values), "q1": q[0], "q3": q[2], "min": min(values), "max": max(values),
            "n": len(values)}


def startup(runs: int, say: Callable[[str], None] = print) -> dict[str, Any]:
    from training.inputs.tenant_code import TenantFunctionPool, parse_ref

    times: dict[str, list[float]] = {m: [] for m in MODES}
    with tempfile.TemporaryDirectory(prefix="rlhfops-bench-sandbox-") as tmp:
        (Path(tmp) / "trivial.py").write_text(TRIVIAL)
        ref = parse_ref("trivial.py:score", Path(tmp), "reward.ref")
        for i in range(runs):
            for mode in MODES if i % 2 == 0 else MODES[::-1]:
                t0 = time.perf_counter()
                with TenantFunctionPool(Path(tmp), workers=1, memory_mb=1024, sandbox=mode) as pool:
                    pool.call(ref, ["p"], ["c"], {}, timeout_s=60)
                    times[mode].append(time.perf_counter() - t0)
        say("start-up: " + ", ".join(f"{m} {statistics.median(v):.3f}s" for m, v in times.items()))
    return {m: {**_spread(v), "runs_s": v} for m, v in times.items()}


def per_step(config: str | Path, steps: int, rounds: int, overrides: dict | None,
             say: Callable[[str], None] = print) -> dict[str, Any]:
    from training.job.config import resolve_config
    from training.trainer import Trainer

    rows: dict[str, dict[str, list[float]]] = {m: {"step_s": [], "reward_fn_s": []} for m in MODES}
    with tempfile.TemporaryDirectory(prefix="rlhfops-bench-sandbox-") as tmp:
        reward = Path(tmp) / "arith_reward.py"
        reward.write_text(ARITH_REWARD)
        for r in range(rounds):
            for mode in MODES if r % 2 == 0 else MODES[::-1]:
                previous = os.environ.get("RLHFOPS_TENANT_SANDBOX")
                os.environ["RLHFOPS_TENANT_SANDBOX"] = mode
                try:
                    cfg = resolve_config(config, {**(overrides or {}), "reward.ref": f"{reward}:score",
                                                  "steps": steps + 1})
                    trainer = Trainer(cfg, "none")
                    try:
                        for rec in trainer.run(steps + 1):
                            if rec.step == 1:
                                continue  # the warm-up step: the workers start
                            rows[mode]["step_s"].append(sum(rec.phase_seconds.values()))
                            rows[mode]["reward_fn_s"].append(rec.phase_seconds.get("reward_fn", 0.0))
                    finally:
                        trainer.close()
                finally:
                    if previous is None:
                        os.environ.pop("RLHFOPS_TENANT_SANDBOX", None)
                    else:
                        os.environ["RLHFOPS_TENANT_SANDBOX"] = previous
                say(f"round {r + 1}/{rounds} {mode}: step {statistics.median(rows[mode]['step_s']):.2f}s, "
                    f"reward_fn {statistics.median(rows[mode]['reward_fn_s']) * 1000:.1f}ms")
    out: dict[str, Any] = {m: {k: {**_spread(v), "values": v} for k, v in d.items()} for m, d in rows.items()}
    on, off = out["bwrap"], out["none"]
    out["reward_fn_extra_s"] = on["reward_fn_s"]["median"] - off["reward_fn_s"]["median"]
    out["share_of_step"] = out["reward_fn_extra_s"] / off["step_s"]["median"]
    return out


def bench_sandbox(config: str | Path, runs: int, steps: int, rounds: int, overrides: dict | None = None,
                  say: Callable[[str], None] = print) -> dict[str, Any]:
    import platform

    load_before = os.getloadavg()[0]
    result: dict[str, Any] = {"config": str(config), "overrides": dict(overrides or {}), "steps_per_round": steps,
                              "rounds": rounds, "startup": startup(runs, say)}
    if steps > 0:
        result["per_step"] = per_step(config, steps, rounds, overrides, say)
    result.update(load_average_1min_before=load_before, load_average_1min_after=os.getloadavg()[0],
                  cpus=os.cpu_count(), python=platform.python_version())
    return result
