"""A bench run's settings and its baseline, read and checked before anything heavy loads (no torch, no numpy): the
`rlhfops bench oppo --baseline` option and the nightly's bench stage refuse a baseline they cannot compare with in
about a second, before the bench's minutes of training."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from common.errors import BadInput


def bench_settings(cfg: Any, quick: bool, steps: int | None = None, seeds: int = 3, gate_every: int = 5,
                   target_frac: float = 0.7) -> dict:
    """A bench run's settings (`cfg`: its `TrainConfig`), the ones a baseline must share (`comparable`): `quick`
    runs 30 steps with a smoothing window of 5 (else the config's steps, window 8); the seeds are the config's seed
    and the next `seeds - 1`."""
    return {"steps": steps or (30 if quick else cfg.steps), "seeds": [cfg.seed + i for i in range(seeds)],
            "target_frac": target_frac, "smooth_window": 5 if quick else 8, "gate_every": gate_every,
            "config": cfg.model_dump(mode="json")}


def same_task(other: Any, cfg: Any, field: str) -> Any:
    """`other` (a TrainConfig) when it trains `cfg`'s task, so a target set on one holds for the other; BadInput
    naming `field` otherwise."""
    if other.task != cfg.task:
        raise BadInput(f"{field}: that config trains another task (its `task` differs from the bench config's): a "
                       "target is only shared on the same task")
    return other


def comparable(result_settings: dict, baseline: dict) -> str | None:
    """Why a baseline cannot be compared with a run of these settings (None: it can)."""
    for key in ("steps", "seeds", "target_frac", "smooth_window", "gate_every"):
        if key not in baseline:
            return f"it has no '{key}' (not a multi-seed `rlhfops bench oppo` JSON)"
        if baseline[key] != result_settings[key]:
            return f"its {key} is {baseline[key]!r}, this run's is {result_settings[key]!r}"
    if "ratios" not in baseline:
        return "it has no 'ratios'"
    if "config" in result_settings and isinstance(baseline.get("config"), dict):
        from common.config import flatten

        mine, theirs = flatten(_as_run(result_settings["config"])), flatten(_as_run(baseline["config"]))
        differ = sorted(k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k))
        if differ:
            k = differ[0]
            more = f" (and {len(differ) - 1} more)" if len(differ) > 1 else ""
            return f"its training config has {k} = {theirs.get(k)!r}, this run's {mine.get(k)!r}{more}"
    return None


def _as_run(config: dict) -> dict:
    """A bench's training config as it ran: the fields a config of older code did not have take their defaults (each
    added field's default is the behaviour before it: bytes for the tokenizer, float32, all heads for k/v), and the
    device is the kind it ran on (`auto` resolved without importing torch; a config without a device ran on the CPU,
    the only device before there was one), so a CPU baseline compares with a CPU run and never with a GPU one."""
    from pydantic import ValidationError

    from training.job.config import ALGORITHM_OF_ADVANTAGE, TrainConfig
    from training.job.device import cuda_absent_reason

    device = config.get("device")
    if "algorithm" not in config and isinstance(config.get("ppo"), dict):
        # before `algorithm`: ppo.advantage named it, and ppo (gae) ignored group_size (one completion per prompt)
        ppo = dict(config["ppo"])
        was = ppo.pop("advantage", "gae")
        algorithm = ALGORITHM_OF_ADVANTAGE.get(was, was)
        config = {**config, "algorithm": algorithm, "ppo": ppo}
        if algorithm == "ppo":
            ppo["group_size"] = 1
    try:
        config = TrainConfig.model_validate(config).model_dump(mode="json")
    except ValidationError:
        config = dict(config)  # a field since removed: compared as written, and the difference named
    config.pop("config_dir", None)  # where the config file lay (a checkout's path), not how the bench ran
    config.pop("cache_dir", None)  # where its warm starts are cached (the default moved out of runs/.cache), likewise
    if device is None or device == "auto":
        config["device"] = "cpu" if device is None or cuda_absent_reason() else "cuda"
    return config


def read_baseline(path: str | Path, settings: dict, field: str) -> dict:
    """The baseline JSON at `path`, comparable with a run of `settings`; else BadInput naming `field` and the fix."""
    try:
        base = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise BadInput(f"{field}: cannot read '{path}' as JSON ({type(err).__name__})") from None
    why = comparable(settings, base) if isinstance(base, dict) else "it is not a JSON object"
    if why:
        raise BadInput(f"{field}: '{path}' cannot be compared with this run: {why} (rerun with the baseline's "
                       "settings)")
    return base
