"""A run's files: checkpoints (save, load, newest), metrics.csv and summary.json.

`CheckpointIO` is a mixin of `training.trainer.Trainer`: it saves and restores the trainer's whole state (weights,
optimisers, the carried buffer, the OPPO controllers, every random generator), so a resumed run's metrics equal an
uninterrupted run's.
"""

from __future__ import annotations

import csv
import json
import random
import shutil
from collections import Counter
from pathlib import Path

import numpy as np
import torch
import yaml
from transformers.utils import logging as hf_logging

from training.metrics import StepRecord
from training.models import frozen_copy
from training.rollout.controllers import deferral_histogram
from training.rollout.engine import KeyedDraws
from training.rollout.streaming import Sequence


class CheckpointIO:
    def save_checkpoint(self) -> Path:
        path = self.out_dir / "checkpoints" / f"step-{self.step:06d}"
        tmp = path.with_name(path.name + ".tmp")
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir(parents=True)
        state = {
            "step": self.step, "wall_s": self.wall_s, "world_size": self.world.size, "next_uid": self.next_uid,
            "overlap": self.overlap,
            "actor": self.actor.state_dict(), "actor_opt": self.actor_opt.state_dict(),
            "critic": self.critic.state_dict() if self.critic is not None else None,
            "critic_opt": self.critic_opt.state_dict() if self.critic_opt else None,
            "buffer": [vars(s) for s in self.buffer],
            "delta_ctl": self.delta_ctl.state_dict(), "tuner": self.tuner.state_dict(),
            "deferral_counts": dict(self.deferral_counts),
            "frozen_actor": self.frozen_actor.state_dict() if self.frozen_actor is not None else None,
            "frozen_version": getattr(self, "frozen_version", None),
            "rng": {"prompt": self.prompt_rng.bit_generator.state, "sample": self.sample_gen.get_state(),
                    "sample_device": self.sample_gen.device.type,
                    "sample_kind": "keyed" if isinstance(self.sample_gen, KeyedDraws) else "stream",
                    "shuffle": self.shuffle_gen.get_state(), "torch": torch.get_rng_state(),
                    "python": random.getstate(), "numpy": np.random.get_state()},
        }
        torch.save(state, tmp / "state.pt")
        hf_logging.disable_progress_bar()  # no "Writing model shards" bar over the CLI's progress display
        self.actor.save_pretrained(tmp / "actor")
        self.tok.hf.save_pretrained(tmp / "actor")  # a complete model dir: usable as model_name_or_path
        (tmp / "config.yaml").write_text(yaml.safe_dump(self.cfg.model_dump(mode="json"), sort_keys=False))
        if path.exists():
            shutil.rmtree(path)
        tmp.rename(path)
        self.checkpoints.append(path)
        keep = self.cfg.keep_checkpoints
        if keep:
            for old in sorted(path.parent.glob("step-*"))[:-keep]:
                shutil.rmtree(old, ignore_errors=True)
        return path

    def load_checkpoint(self, path: Path) -> None:
        # read onto the CPU whichever device wrote it; load_state_dict copies weights and AdamW state onto the job's
        # device (no second copy of the whole state on a GPU)
        state = torch.load(Path(path) / "state.pt", map_location="cpu", weights_only=False)
        self.step, self.wall_s, self.next_uid = state["step"], state["wall_s"], state["next_uid"]
        self.actor.load_state_dict(state["actor"])
        self.actor_opt.load_state_dict(state["actor_opt"])
        if self.critic is not None:
            self.critic.load_state_dict(state["critic"])
            self.critic_opt.load_state_dict(state["critic_opt"])
        self.buffer = [Sequence(**d) for d in state["buffer"]]
        self.delta_ctl.load_state_dict(state["delta_ctl"])
        self.tuner.load_state_dict(state["tuner"])
        self.deferral_counts = Counter({int(k): v for k, v in state["deferral_counts"].items()})
        if state["frozen_actor"] is not None:
            self.frozen_actor = frozen_copy(self.actor)
            self.frozen_actor.load_state_dict(state["frozen_actor"])
            self.frozen_version = state["frozen_version"]
        rng = state["rng"]
        self.prompt_rng.bit_generator.state = rng["prompt"]
        kind = "keyed" if isinstance(self.sample_gen, KeyedDraws) else "stream"
        if kind == "keyed":  # stateless: nothing to restore
            pass
        elif rng.get("sample_kind", "stream") == "stream" and rng.get("sample_device", "cpu") == \
                self.sample_gen.device.type:
            self.sample_gen.set_state(rng["sample"])
        else:  # a CPU generator's state does not fit a CUDA one, nor keyed draws a stream: reseeded by step (no longer
            # an uninterrupted run's)
            self.sample_gen.manual_seed(self.cfg.seed * 1000 + 1 + self.step)
        self.shuffle_gen.set_state(rng["shuffle"])
        torch.set_rng_state(rng["torch"])
        random.setstate(rng["python"])
        np.random.set_state(rng["numpy"])

    def _write_summary(self) -> None:
        summary = {"overlap": self.overlap, "steps": self.step, "wall_s": self.wall_s,
                   "deferral_histogram": deferral_histogram(self.deferral_counts),
                   "delta": self.delta_ctl.delta, "chunk_size": self.tuner.current,
                   "checkpoints": [str(p) for p in sorted((self.out_dir / "checkpoints").glob("step-*"))]}
        (self.out_dir / "summary.json").write_text(json.dumps(summary, indent=2))


class MetricsCSV:
    """metrics.csv writer; on resume it keeps only rows up to the checkpoint's step."""

    def __init__(self, path: Path, resume_step: int):
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        rows = []
        self.fields = list(StepRecord(step=0, policy_version=0, reward_mean=0.0).flat())
        if path.exists() and resume_step > 0:
            with path.open() as f:
                reader = csv.DictReader(f)
                rows = [r for r in reader if int(r["step"]) <= resume_step]
                self.fields += [k for k in reader.fieldnames or [] if k not in self.fields]
        self.f = None
        self._rewrite(rows)

    def _rewrite(self, rows: list[dict]) -> None:
        """The file anew with the current columns (a reward function's own metrics add columns as they appear)."""
        if self.f is not None:
            self.f.close()
        self.f = self.path.open("w", newline="")
        self.w = csv.DictWriter(self.f, fieldnames=self.fields)
        self.w.writeheader()
        for r in rows:
            self.w.writerow({k: r.get(k, "") for k in self.fields})
        self.f.flush()

    def write(self, record: StepRecord) -> None:
        row = record.flat()
        new = [k for k in row if k not in self.fields]
        if new:
            self.f.close()
            with self.path.open() as f:
                rows = list(csv.DictReader(f))
            self.fields += new
            self._rewrite(rows)
        self.w.writerow(row)
        self.f.flush()

    def close(self) -> None:
        self.f.close()


def latest_checkpoint(out_dir: str | Path) -> Path | None:
    ckpts = sorted(Path(out_dir).glob("checkpoints/step-[0-9]*[0-9]"))
    return ckpts[-1] if ckpts else None
