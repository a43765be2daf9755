"""The GPU check's dry mode on CPU (`scripts/gpu-check --device cpu --dry`): the script runs end to end and its JSON
has every key of the GPU check contract (docs/oppo.md "GPU check"), with finite numbers."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MODES = ("none", "intra", "inter", "full")
PHASES = ("rollout", "score", "sync", "optim")


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def test_dry_run_writes_every_key(tmp_path):
    env = {**os.environ, "PYTHON": sys.executable, "OMP_WAIT_POLICY": "PASSIVE"}
    proc = subprocess.run(["bash", str(REPO / "scripts" / "gpu-check"), "--device", "cpu", "--dry", "--out",
                           str(tmp_path)], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "done:" in proc.stdout
    d = json.loads((tmp_path / "gpu-check.json").read_text())
    assert d["device"] == "cpu" and d["torch"] and d["transformers"]
    nccl = d["nccl_world1"]  # gloo on the CPU dry run: a one-rank group's all-reduce leaves the buffer as it was
    assert nccl["backend"] == "gloo" and nccl["world_size"] == 1 and nccl["sum_ok"] is True
    assert nccl["bytes"] == 4 * nccl["numel"] > 0 and _finite(nccl["allreduce_ms"]) and nccl["allreduce_ms"] > 0

    real = d["real_shape"]
    assert real["config"]["policy"]["num_kv_heads"] == 2 and real["config"]["dtype"] == "bfloat16"
    assert set(real["decode_ms_by_rows"]) == {"1", "2", "4"}
    assert all(_finite(v) and v > 0 for v in real["decode_ms_by_rows"].values())
    assert set(real["modes"]) == set(MODES)
    for m in real["modes"].values():
        assert _finite(m["step_s"]) and m["step_s"] > 0
        assert set(m["phases_s"]) == set(PHASES) and all(_finite(v) for v in m["phases_s"].values())
        assert m["phases_s"]["rollout"] > 0 and m["phases_s"]["optim"] > 0
        assert _finite(m["tokens_per_s"]) and m["tokens_per_s"] > 0
        assert _finite(m["peak_gpu_mem_gib"])
    # the speedup is sequential's step time over the mode's (checked against the recorded step times)
    for mode, v in real["step_speedup"].items():
        assert v == real["modes"]["none"]["step_s"] / real["modes"][mode]["step_s"]

    small = d["small_shape"]
    assert small["config"]["ppo"]["max_new_tokens"] == 12 and small["config"]["task"]["length_dist"] == "lognormal"
    assert set(small["modes"]) == set(MODES) | {"grpo/none", "grpo/full"}  # the GRPO row beside PPO's modes
    for m in small["modes"].values():
        assert _finite(m["final_gold_heldout"]) and _finite(m["final_gold_heldout_se"])
        assert m["time_to_gold_s"] is None or _finite(m["time_to_gold_s"])  # null: the target was not reached
    assert set(small["speedup_gold"]) == {"intra", "inter", "full", "grpo/none", "grpo/full"}
    assert all(v is None or _finite(v) for v in small["speedup_gold"].values())
