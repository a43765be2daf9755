"""The trainer's side of a job on several ranks (`RankSteps`, a mixin of `training.trainer.Trainer`).

Every rank holds the same view of the step: the same prompt stream (the same seed), the same buffer of units in
flight, the same samples once a step's rollout is over. What a rank does alone is the expensive part: it rolls out
the units `assign_units` gave it (a carried unit stays on its rank) and back-propagates the samples it rolled out.
In between:

1. inter-step overlap: the stop is decided over all ranks at every decode step (finished units and live rows summed
   over ranks), and the first B units to finish are chosen over all ranks by (decode step, unit id): the order one
   rank uses, so one rank and N ranks choose the same units;
2. every rank scores its own samples (a tenant's reward function runs in each rank's own pool), then the step's
   samples and the deferred units are gathered, in uid order, on every rank: advantages, whitening, the step's
   statistics and the minibatch shuffle are computed on the whole batch, identically everywhere;
3. the update (training/algorithms/update.py) back-propagates this rank's share of each minibatch (split again by
   tokens, `split_minibatch`: the rollout's split is by expected tokens and the responses' lengths then differ), each
   token's loss divided by the minibatch's GLOBAL token count, and sums the gradients over ranks before clipping:
   the full batch's gradient, whatever the layout.

The samples cross between ranks with their per-token tensors as numpy arrays (`_to_wire`): a torch tensor is far
slower to pickle and unpickle than an array, and every sample crosses to every rank every step.
"""

from __future__ import annotations

import dataclasses
import os
import time

import numpy as np
import torch

from training.distributed.plan import assign_units, split_minibatch
from training.metrics import PHASES
from training.rollout.streaming import RolloutResult, rollout


class RankSteps:
    def _rank_fault(self) -> None:
        """fault.kind rank_exit / rank_hang: this rank dies or hangs at the start of step at_step + 1."""
        f = self.cfg.fault
        if f.kind in ("rank_exit", "rank_hang") and self.world.rank == f.rank and self.step == f.at_step:
            if f.times and self.out_dir is not None:  # only on the job's first `times` starts: one marker each
                fired = sorted(self.out_dir.glob(f".fault-{f.kind}-rank{f.rank}-*"))
                if len(fired) >= f.times:
                    return
                (self.out_dir / f".fault-{f.kind}-rank{f.rank}-{len(fired) + 1}").touch()
            if f.kind == "rank_exit":
                os._exit(3)
            time.sleep(10**6)

    def _rollout_ranks(self, chunk: int) -> RolloutResult:
        """This rank's share of the step's rollout (see the module docstring); returns its chosen samples and its
        deferred units."""
        cfg, world = self.cfg, self.world
        lengths = getattr(self, "last_response_lengths", None)
        expected = float(np.mean(lengths)) if lengths else cfg.ppo.max_new_tokens / 2
        owners = assign_units(self.buffer, world.size, expected)
        for s in self.buffer:
            s.rank = owners[s.group]
        local = [s for s in self.buffer if s.rank == world.rank]
        until = None
        if self.overcommit:
            need = self.units_per_step

            def until(units: int, live: int) -> bool:
                g_units, g_live = world.sum([units, live])
                return g_units >= need or g_live == 0

            units_needed = need
        else:
            units_needed = len({s.group for s in local}) if self.grouped else len(local)
        if not local:  # nothing here this step: take part in the stop until the others are done
            while until is not None and not until(0, 0):
                pass
            return RolloutResult([], [], 0, 0.0, 0.0, 0)
        out = rollout(
            self.engine, self.scorers, local, pad_id=self.tok.pad_id, units_needed=units_needed,
            max_new_tokens=cfg.ppo.max_new_tokens, chunk_size=chunk, stream=self.stream, generator=self.sample_gen,
            grouped=self.grouped, scorer_threads=1, device=self.device, until=until, apart=self.apart,
        )
        if self.overcommit:
            out = self._first_over_ranks(out)
        return out

    def _unit(self, sample) -> int:
        return sample.seq.group if self.grouped else sample.seq.uid

    def _first_over_ranks(self, out: RolloutResult) -> RolloutResult:
        """Keep this rank's units among the first B to finish over all ranks (ties: the lower unit id); the others
        go back to its deferred units."""
        finished: dict[int, float] = {}
        for part in self.world.gather([(s.finish_step, self._unit(s)) for s in out.samples]):
            for t, u in part:
                finished[u] = max(finished.get(u, -np.inf), t)
        chosen = set(sorted(finished, key=lambda u: (finished[u], u))[: self.units_per_step])
        keep = [s for s in out.samples if self._unit(s) in chosen]
        back = {s.seq.uid: s.seq for s in out.samples if self._unit(s) not in chosen}
        out.samples = keep
        out.deferred = sorted(out.deferred + list(back.values()), key=lambda q: q.uid)
        return out

    def _gather_step(self, samples: list, out: RolloutResult, scored: tuple[int, int], cpu_s: float
                     ) -> tuple[list, RolloutResult, float, float]:
        """Every rank's samples and deferred units, in uid order, on every rank; the rollout's figures over ranks
        (tokens summed, seconds and decode steps the slowest rank's)."""
        parts = self.world.gather({"samples": _to_wire(samples), "deferred": out.deferred,
                                   "tokens": out.tokens_generated, "steps": out.decode_steps,
                                   "decode_s": out.decode_s, "score_s": out.score_s, "scored": scored,
                                   "cpu_s": cpu_s, "reward_metrics": getattr(self, "_reward_metrics", {})})
        self._reward_metrics = reward_metrics_over_ranks([(p["reward_metrics"], len(p["samples"])) for p in parts])
        samples = sorted((s for p in parts for s in _from_wire(p["samples"])), key=lambda s: s.seq.uid)
        deferred = sorted((q for p in parts for q in p["deferred"]), key=lambda q: q.uid)
        merged = RolloutResult(samples, deferred, sum(p["tokens"] for p in parts),
                               max(p["decode_s"] for p in parts), max(p["score_s"] for p in parts),
                               max(p["steps"] for p in parts))
        got, total = (sum(p["scored"][k] for p in parts) for k in (0, 1))
        no_score = 1.0 - got / max(1, total)
        return samples, merged, no_score, sum(p["cpu_s"] for p in parts)

    def _phases_over_ranks(self, phases: dict[str, float]) -> tuple[dict[str, float], float]:
        """The step's phase seconds, the slowest rank's each, and `rank_idle_s`: the most any rank waited inside
        this step's collectives (this last reduction's own wait counts in the next step)."""
        names = sorted(set(PHASES) | set(phases))
        phases = {k: phases.get(k, 0.0) for k in names}
        got = self.world.max([phases[k] for k in names] + [self.world.take_idle()])
        return dict(zip(names, got[:-1], strict=True)), got[-1]

    def _broadcast_weights(self) -> None:
        """Every rank starts from rank 0's weights (as DDP does when it wraps a model)."""
        for m in (self.actor, self.critic, self.ref, self.reward_model):
            self.world.broadcast_module(m)

    def _owned(self, idx: list[int], samples: list) -> list[int]:
        """The minibatch's samples this rank back-propagates (all of them on one rank): its share of the minibatch's
        tokens (`split_minibatch`, the same split on every rank)."""
        if self.world.size == 1:
            return idx
        costs = [len(samples[i].seq.prompt_ids) + len(samples[i].seq.response_ids) for i in idx]
        return split_minibatch(idx, costs, self.world.size)[self.world.rank]


#: a Sample's per-token tensors (training/rollout/streaming.py)
_TENSOR_FIELDS = ("old_logprobs", "ref_logprobs", "values", "behav_logprobs")


def _to_wire(samples: list) -> list:
    """The samples with their float32 tensors as numpy arrays, for the gather (see the module docstring)."""
    def wire(s):
        got = {k: getattr(s, k) for k in _TENSOR_FIELDS}
        return dataclasses.replace(s, **{k: t.detach().cpu().numpy() for k, t in got.items()
                                         if isinstance(t, torch.Tensor) and t.dtype == torch.float32})
    return [wire(s) for s in samples]


def _from_wire(samples: list) -> list:
    """`_to_wire` undone: the arrays as (CPU) tensors again."""
    def unwire(s):
        got = {k: getattr(s, k) for k in _TENSOR_FIELDS}
        return dataclasses.replace(s, **{k: torch.from_numpy(a) for k, a in got.items() if isinstance(a, np.ndarray)})
    return [unwire(s) for s in samples]


def reward_metrics_over_ranks(parts: list[tuple[dict[str, float], int]]) -> dict[str, float]:
    """A reward function's figures of the whole batch from each rank's (its figures, its samples): each name's mean
    over the ranks that reported it (a NaN is no report), weighted by their samples (a function's mean over its rank's
    batch is then its mean over the global batch; a value the tenant logged is averaged as its batches were)."""
    out: dict[str, float] = {}
    for name in sorted({k for metrics, _ in parts for k in metrics}):
        got = [(metrics[name], n) for metrics, n in parts
               if name in metrics and n > 0 and not np.isnan(metrics[name])]
        total = sum(n for _, n in got)
        if total:
            out[name] = sum(v * n for v, n in got) / total
    return out
