"""data/prompts/build_prompt_runs.py plans exactly the runs data/prompts/DECLARATION-fresh.md declares for the fresh
report part: the seeds, the variants and their overrides, the run config, the sealed destination, read from the
declaration's own text (the oracle), never from the script. No training here (200 runs of ~90 s each)."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DECLARATION = REPO / "data" / "prompts" / "DECLARATION-fresh.md"


def _load_script():
    spec = importlib.util.spec_from_file_location("build_prompt_runs",
                                                  REPO / "data" / "prompts" / "build_prompt_runs.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


build = _load_script()


def _set(tree: dict, dotted: str, value) -> None:
    *path, last = dotted.split(".")
    for key in path:
        tree = tree.setdefault(key, {})
    tree[last] = value


def _overrides(text: str) -> dict:
    """`ppo.kl_coef 0.05, ppo.actor_lr 3e-4, fault gameable_reward at step 40, bonus 0.5` -> the overrides dict."""
    out: dict = {}
    for item in (part.strip() for part in text.split(",")):
        if m := re.fullmatch(r"fault (\w+) at step (\d+)", item):
            _set(out, "fault.kind", m[1])
            _set(out, "fault.at_step", int(m[2]))
        elif m := re.fullmatch(r"bonus ([\d.e-]+)", item):
            _set(out, "fault.bonus", float(m[1]))
        else:
            key, value = item.split(" ")
            _set(out, key, float(value))
    return out


def _declared():
    """(seeds, runs count, [(variant, overrides)] in table order, config `key: value` pairs, sealed dir) as the
    declaration writes them."""
    text = DECLARATION.read_text()
    lo, hi = map(int, re.search(r"on each of the \d+ seeds \*\*(\d+)-(\d+)\*\*", text).groups())
    count = int(re.search(r"\*\*(\d+) runs\*\*", text)[1])
    variants = [(m[1], _overrides(m[2])) for m in re.finditer(r"^\| `([^`]+)` \| `([^`]+)` \|$", text, re.M)]
    runs_section = text.split("## Runs", 1)[1].split("|", 1)[0]
    config = dict(re.findall(r"`([\w.]+): (\w+)`", runs_section))
    sealed = re.search(r"Recorded into `(data/sealed/[\w/]+)/`", text)[1]
    return tuple(range(lo, hi + 1)), count, variants, config, sealed


def test_the_fresh_plan_is_the_declared_run_list():
    seeds, count, variants, _, _ = _declared()
    assert seeds == tuple(range(72, 92)) and len(variants) == 10 and count == 200
    want = [(f"own-prompts/{name}/seed{seed}", over, seed) for seed in seeds for name, over in variants]
    got = build.plan("fresh")
    assert [(rid, seed) for rid, _, seed in got] == [(rid, seed) for rid, _, seed in want]
    assert [over for _, over, _ in got] == [over for _, over, _ in want]
    assert len(got) == count == len({rid for rid, _, _ in got})
    # none of its seeds was used by an earlier part (data/curves 0-55, data/prompts 56-71)
    assert min(seeds) > max(build.TUNE_SEEDS + build.REPORT_SEEDS) and min(seeds) > 55
    assert {build.part_of(seed) for seed in seeds} == {"fresh"}


def test_the_fresh_runs_use_the_declared_config(tmp_path):
    seeds, _, variants, config, _ = _declared()
    assert config == {"steps": "100", "eval_every": "5", "eval_prompts": "64", "task.n_heldout_prompts": "128",
                      "eval_extra_batch": "32", "oppo.torch_threads": "1", "overlap": "none"}
    for rid, over, seed in build.plan("fresh", seeds=(seeds[0], seeds[-1])):
        cfg = build.run_config(over, seed, tmp_path)
        assert (cfg.seed, cfg.steps, cfg.eval_every, cfg.eval_prompts) == (seed, 100, 5, 64)
        assert (cfg.task.n_heldout_prompts, cfg.eval_extra_batch, cfg.oppo.torch_threads) == (128, 32, 1)
        declared = dict(variants)[rid.split("/")[1]]
        assert (cfg.ppo.kl_coef, cfg.ppo.actor_lr) == (declared["ppo"]["kl_coef"], declared["ppo"]["actor_lr"])
        fault = declared.get("fault", {"kind": "none"})
        assert cfg.fault.kind == fault["kind"]
        if "at_step" in fault:
            assert (cfg.fault.at_step, cfg.fault.bonus) == (fault["at_step"], fault["bonus"])


def test_the_fresh_part_is_assembled_sealed_and_listed(capsys):
    _, count, _, _, sealed = _declared()
    assert build.PARTS["fresh"][1] == REPO / sealed == REPO / "data" / "sealed" / "prompts_fresh"
    assert build.main(["--part", "fresh", "--list", "--work", "/nonexistent-work-dir"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == count and lines[0].split() == ["0", "own-prompts/kl0.2-lr3e-4/seed72", "fresh"]
    assert lines[-1].split() == [str(count - 1), "own-prompts/game40-kl0.1-lr3e-4/seed91", "fresh"]


def test_seeds_outside_the_part_are_refused():
    with pytest.raises(SystemExit, match=r"--seeds: \[60\] are not the fresh part's declared seeds \(72-91\)"):
        build.main(["--part", "fresh", "--seeds", "60,72", "--list"])
    with pytest.raises(SystemExit, match=r"\[72\] are not the first corpus's declared seeds \(56-71\)"):
        build.main(["--seeds", "72", "--list"])
    assert len(build.plan("fresh", seeds=(80,), half="b")) == 5
