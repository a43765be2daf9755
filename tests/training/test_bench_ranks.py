"""`rlhfops bench ranks --quick` on tiny configs: every part runs (two ranks spawned, the scorer process apart), the
JSON has the keys docs/ranks.md reads, and its figures are consistent with the runs they come from."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from tiny_job import tiny_config

REPO = Path(__file__).resolve().parents[2]
RLHFOPS = str(Path(sys.executable).parent / "rlhfops")


def _yaml(path: Path, cfg) -> Path:
    path.write_text(yaml.safe_dump(cfg.model_dump(mode="json", exclude={"config_dir"}), sort_keys=False))
    return path


@pytest.mark.slow
def test_bench_ranks_quick_writes_every_figure(tmp_path, cache):
    grpo = _yaml(tmp_path / "tiny-grpo.yaml", tiny_config(cache, seed=0, n_heldout_prompts=8, algorithm="grpo",
                                                          ppo={"group_size": 2, "batch_size": 8}))
    ppo = _yaml(tmp_path / "tiny-ppo.yaml", tiny_config(cache, seed=0, n_heldout_prompts=8))
    out = tmp_path / "ranks.json"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([RLHFOPS, "bench", "ranks", "--quick", "--config", str(grpo), "--placement-config", str(ppo),
                           "--out", str(out)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    res = json.loads(out.read_text())
    assert set(res) >= {"settings", "throughput", "placement", "time_to_target", "load", "machine", "wall_s"}
    settings = res["settings"]
    assert settings["quick"] and (settings["steps"], settings["placement_steps"], settings["repeats"]) == (1, 2, 1)
    t = res["throughput"]["tiny-grpo"]
    assert t["algorithm"] == "grpo" and t["batch_size"] == 8
    assert set(t["samples_per_s"]) == {"world1-1thread", "world1-2threads", "world2-1thread",
                                       "two-independent-1thread"}
    (pair,) = t["runs"].pop("two-independent-1thread")  # the ceiling: two one-process runs at once, summed
    assert pair["processes"] == 2 and len(pair["each"]) == 2
    assert pair["samples_per_s"] == pytest.approx(sum(8 / sum(r["step_s"]) for r in pair["each"]))
    assert [r["tokens"] for r in pair["each"]] == [pair["tokens"]] * 2  # the same work in both
    ceiling = t["samples_per_s"]["two-independent-1thread"]["median"]
    assert t["ratios"]["world2_over_ceiling"]["median"] == pytest.approx(
        t["samples_per_s"]["world2-1thread"]["median"] / ceiling)
    for label, runs in t["runs"].items():
        (run,) = runs  # one repeat
        assert run["samples"] == [8], label  # the global batch, whatever the world size
        assert run["samples_per_s"] == pytest.approx(8 / sum(run["step_s"]))
        assert t["samples_per_s"][label]["median"] == run["samples_per_s"]
        assert (run["idle_share"] is None) == (label != "world2-1thread")
        assert (run["world_size"], run["threads"]) == {"world1-1thread": (1, 1), "world1-2threads": (1, 2),
                                                       "world2-1thread": (2, 1)}[label]
        assert all(isinstance(run[k], float) for k in ("load_before", "load_after"))
    two, one = (t["samples_per_s"][k]["median"] for k in ("world2-1thread", "world1-1thread"))
    assert t["ratios"]["world2_over_world1_1thread"]["median"] == pytest.approx(two / one)
    assert set(t["goal"]) == {"world2_over_world1_1thread_at_least", "met_1thread", "ahead_of_2threads",
                              "short_of_1.8x_by"}
    # equal work: keyed draws give every column the same tokens
    toks = {label: runs[0]["tokens"] for label, runs in t["runs"].items()}
    assert len({tuple(v) for v in toks.values()}) == 1, toks
    p = res["placement"]["tiny-ppo"]
    assert set(p["step_s"]) == {"none/colocated", "intra/colocated", "intra/reward_apart"}
    seq, apart = p["step_s"]["none/colocated"]["median"], p["step_s"]["intra/reward_apart"]["median"]
    assert p["intra_speedup_reward_apart"]["median"] == pytest.approx(seq / apart)
    assert "samples/s" in done.stdout and "reward_apart" in done.stdout and "load average" in done.stdout


@pytest.mark.slow
def test_time_to_target_times_both_world_sizes_on_their_gates(cache):
    from training.benches.ranks import time_to_target

    cfg = tiny_config(cache, seed=0, n_heldout_prompts=8, eval_every=2)
    seen = []
    res = time_to_target(cfg, steps=4, progress=lambda label, step: seen.append((label, step)))
    assert seen == [(label, k) for label in ("world1-1thread", "world2-1thread") for k in (1, 2, 3, 4)]
    one, two = res["curves"]["world1-1thread"], res["curves"]["world2-1thread"]
    assert [g[0] for g in one["gates"]] == [g[0] for g in two["gates"]] == [2, 4]
    for c in (one, two):
        clocks = [g[1] for g in c["gates"]]
        assert 0 < clocks[0] < clocks[1]
        assert c["final_gold"] == c["gates"][-1][2]
    first = one["gates"]
    best = max(g[2] for g in first)
    assert res["target"] == pytest.approx(first[0][2] + 0.7 * (best - first[0][2]))
    # world 1 reaches its own target by definition (at its best gate at the latest), at its first gate at or above it
    hit = next(g for g in first if g[2] >= res["target"])
    assert (one["step_at_target"], one["time_to_target_s"]) == (hit[0], hit[1])
