"""The OPPO-accelerated PPO trainer. Plain Python entry points for the CLI, Prefect flows and canaries.

Entry points (stable):
- `train(config, overlap="full", out_dir=None, steps=None, resume=True) -> Iterator[StepRecord]`
  runs PPO and yields one `training.metrics.StepRecord` per step. With `out_dir` it writes
  `out_dir/metrics.csv` (one row per step, `StepRecord.flat()`), checkpoints under
  `out_dir/checkpoints/step-NNNNNN/` every `checkpoint_every` steps (and at the end), and
  `out_dir/summary.json`; with `resume=True` it continues from the newest checkpoint there, and the
  resumed run's metrics are identical to an uninterrupted run's (timing fields aside).
- `Trainer(config, overlap, out_dir, resume=True, progress=None, slot=None)` is the same thing as an object:
  `.run(steps)` yields records; `.checkpoints` lists the saved checkpoint paths; `.deferral_counts` holds the
  deferral histogram; `.device` is where its models live (the config's `device`; `slot`, the GPU slot the job holds,
  picks the card under `auto`: training/job/device.py). A `torch.OutOfMemoryError` in a step is raised as
  `training.job.device.DeviceOutOfMemory`, naming the step and the checkpoint kept.
- `gold_eval(checkpoint_path_or_policy, prompts=None, config=None) -> GoldEval` scores a saved
  checkpoint (or a live policy) with the gold scorer on held-out prompts. Use it as an eval gate.
- `latest_checkpoint(out_dir)` finds the newest checkpoint of a run.

`overlap`: "none" (sequential PPO), "intra" (stream chunks to the scorers while decoding), "inter"
(overcommit B+Delta prompts, train on the first B to finish, defer the rest), "full" (both).

Fault injection for the health canaries (`fault:` block of the config; active from `fault.at_step`):
- `frozen_sync`: the generation engine keeps sampling from a frozen copy of the actor taken at
  `at_step` (a broken weight sync): approx-KL and clip fraction climb, reward stalls.
- `constant_reward`: every reward-model score is replaced by 0 (a dead reward service).
- `nan_reward`: every score is NaN (a corrupt reward service; the loss goes NaN).
- `lr_spike`: actor and critic learning rates are multiplied by `fault.factor`.
- `gameable_reward`: the proxy score gets `fault.bonus` per occurrence of `fault.trigger` in the
  response, which the gold scorer does not value: fast reward hacking.
- `behaviour_mismatch`: the engine samples at `fault.factor` times the configured temperature while the
  trainer assumes the configured one (an inference/training mismatch): the importance weights
  pi_prox/pi_behav spread and their effective sample size falls.
- `duplicated_carry`: a response carried to the next step has its tokens so far appended twice (a broken
  resume path), so carried samples grow longer than fresh ones.
Plain knobs do the rest: `ppo.kl_coef` small (see configs/ppo-hack.yaml) for over-optimisation,
`ppo.actor_lr` for an oversized learning rate.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from common.errors import BadInput
from training.algorithms.update import PPOUpdate
from training.checkpoint import CheckpointIO, MetricsCSV, latest_checkpoint
from training.distributed.apart import scorer_placement
from training.distributed.launch import LocalRanks, Rendezvous
from training.distributed.plan import check_world
from training.distributed.ranks import RankSteps
from training.distributed.world import LOCAL, World, rank_threads
from training.evaluation import EvalGate, GoldEval, generate, gold_eval
from training.gate import GATE_RECORDS, GateRecordsCSV, PromptRecord
from training.inputs.job_inputs import job_inputs
from training.inputs.scorers import RewardFunctions
from training.inputs.synthetic_task import parseable
from training.inputs.tokenizer import Tokenizer, tokenizer_for
from training.job.config import TrainConfig, uses_critic, uses_reference
from training.job.device import autocast, check_gpu_memory, out_of_memory, resolve_device, torch_dtype
from training.metrics import NAN, StepRecord
from training.models import _max_positions, base_policy, build_scorer, frozen_copy, proxy_reward_model
from training.rollout.continuous import ContinuousEngine, continuous_rollout
from training.rollout.controllers import ChunkTuner, DeltaController
from training.rollout.engine import IncrementalScorer, KeyedDraws, TransformersEngine
from training.rollout.streaming import Sample, Sequence, rollout

__all__ = ["OVERLAPS", "GoldEval", "MetricsCSV", "Trainer", "check_overlap", "generate", "gold_eval",
           "latest_checkpoint", "train"]

OVERLAPS = ("none", "intra", "inter", "full")


def check_overlap(overlap: str) -> str:
    if overlap not in OVERLAPS:
        raise BadInput(f"overlap: '{overlap}' is not one of {', '.join(OVERLAPS)}")
    return overlap



class Trainer(PPOUpdate, CheckpointIO, EvalGate, RankSteps):
    """One PPO run (see the module docstring). The update, the run's files, the eval gate and a rank's share of a job
    on several ranks are mixins: training/algorithms/update.py, training/checkpoint.py, training/evaluation.py,
    training/distributed/ranks.py. `gpus`: the job's ranks (its GPU slots); `world`: this rank's place in them (a
    `Rendezvous` to join, a joined `World`; None: rank 0, which spawns the others when `run` starts)."""

    def __init__(self, config: TrainConfig, overlap: str = "full", out_dir: str | Path | None = None,
                 resume: bool = True, progress=None, slot: int | None = None, gpus: int = 1,
                 world: World | Rendezvous | None = None):
        self.cfg = cfg = config
        check_world(cfg, gpus)
        self.gpus, self.resume, self.slot = gpus, resume, slot
        self.world: World = world if isinstance(world, World) else LOCAL
        self._rendezvous = world if isinstance(world, Rendezvous) else None
        self._ranks: LocalRanks | None = None
        rank = world.rank if world is not None else 0
        self.overlap = check_overlap(overlap)
        self.stream = overlap in ("intra", "full")
        self.overcommit = overlap in ("inter", "full")
        self.out_dir = Path(out_dir) if out_dir else None
        self.progress = progress  # optional callable(str) for long setup work
        if cfg.engine == "vllm" and not cfg.policy.model_name_or_path:
            raise BadInput("engine: 'vllm' needs policy.model_name_or_path (a checkpoint vLLM can load)")
        # the device first: a CUDA device that is not there, or too little GPU memory, is refused before any model
        # is built (training/job/device.py); `slot`: the GPU slot the job holds, picking the card under `device: auto`
        self.device = resolve_device(cfg.device, (slot or 0) + rank if gpus > 1 else slot)
        check_gpu_memory(cfg, self.device)
        #: torch threads: the config's on one rank; OMP_NUM_THREADS or the cores divided among the ranks on several
        self.threads = rank_threads(gpus, self.device.type, cfg.oppo.torch_threads)
        torch.set_num_threads(self.threads)
        #: grpo and rloo train whole groups of `group_size` completions of one prompt (a group is the unit a step
        #: trains and inter-step overlap carries); ppo's unit is one completion, `group_size` of them per prompt
        self.grouped = cfg.algorithm != "ppo"
        self.group_size = cfg.ppo.group_size
        self.units_per_step = cfg.ppo.batch_size // self.group_size if self.grouped else cfg.ppo.batch_size

        self._say(f"building tokenizer, base policy{' and reward model' * (cfg.reward.kind != 'function')} (cached)")
        self.tok: Tokenizer = tokenizer_for(cfg)
        #: the job's prompts and their columns (training/inputs/job_inputs.py): the synthetic task or the tenant's data
        #: set
        self.inputs = job_inputs(cfg, self.tok, warn=self._say)
        #: the tenant's functions run in child processes (training/inputs/tenant_code.py), started when first called
        self._pool = None
        self._no_score_frac = 0.0
        self.reward_fn = (RewardFunctions(cfg.reward, cfg.config_dir, self.tenant_pool)
                          if cfg.reward.kind == "function" else None)
        self._reward_metrics: dict[str, float] = {}
        if self.reward_fn is not None:  # loaded and its signature checked before the warm start
            self.reward_fn.check(list(self.inputs.columns("train", [0])) if self.inputs.n_train else [])
        base = base_policy(cfg, self.tok, self.device, self.inputs)
        # trainable models keep float32 weights (and AdamW state); the frozen ones are stored at the job's dtype
        frozen_dtype = torch_dtype(cfg.dtype)
        # no KL paid (grpo's default beta 0): no reference model is built, stored or run
        self.ref = frozen_copy(base).to(frozen_dtype) if uses_reference(cfg) else None
        self.actor = base
        self.actor.train(False)
        self.reward_model = (None if self.reward_fn is not None else
                             frozen_copy(proxy_reward_model(cfg, self.tok, self.device)).to(frozen_dtype))
        self.critic = None
        if uses_critic(cfg):  # ppo's value model; grpo and rloo take their baseline from the group
            self.critic = build_scorer(cfg.policy, self.tok, _max_positions(cfg)).to(self.device)
            body = {k: v for k, v in base.state_dict().items() if not k.startswith("lm_head")}
            self.critic.load_state_dict(body, strict=False)
            torch.nn.init.zeros_(self.critic.score.weight)
            self.critic.train(False)
        self.actor_opt = torch.optim.AdamW(self.actor.parameters(), lr=cfg.ppo.actor_lr, weight_decay=0.0)
        self.critic_opt = (torch.optim.AdamW(self.critic.parameters(), lr=cfg.ppo.critic_lr, weight_decay=0.0)
                           if self.critic is not None else None)
        if cfg.engine == "vllm":  # pragma: no cover - GPU only, never run here (see training/rollout/engine.py)
            from training.rollout.engine import VLLMEngine

            self.engine = VLLMEngine(cfg.policy.model_name_or_path, self.tok.eos_id, self.tok.pad_id,
                                     cfg.ppo.temperature)
        # inter-step overlap refills rows (training/rollout/continuous.py)
        elif cfg.engine == "continuous" and self.overcommit:
            self.engine = ContinuousEngine(self.tok.eos_id, self.tok.pad_id, cfg.ppo.temperature,
                                           refill_min=cfg.oppo.refill_min)
        else:
            self.engine = TransformersEngine(self.tok.eos_id, self.tok.pad_id, cfg.ppo.temperature)
        # the reward/reference scorers: in this process (colocated) or on a process of their own (reward_apart:
        # `self.apart`, started in `run`); the critic stays with the policy that trains it
        self.scorers, self.apart = scorer_placement(cfg, self.ref, self.reward_model, self.device)
        if self.critic is not None:
            self.scorers["critic"] = IncrementalScorer(self.critic, "value")

        o = cfg.oppo
        self.delta_ctl = DeltaController(o.delta_init if self.overcommit else 0, o.delta_min if self.overcommit else 0,
                                         o.delta_max if self.overcommit else 0, o.delta_window, o.delta_rule,
                                         o.adaptive_delta and self.overcommit)
        self.tuner = ChunkTuner(o.chunk_size, o.chunk_candidates, o.tune_every, o.tune_chunk and self.stream)
        self.prompt_rng = np.random.default_rng([cfg.seed, 404])
        # sampling draws from the logits where they are; the minibatch shuffle stays on the CPU (the same order on
        # every device)
        # (`sampling: keyed`, the default on several ranks: each draw keyed by seed, sample and position)
        self.sample_gen = (KeyedDraws(cfg.seed * 1000 + 1, self.device)
                           if cfg.sampling == "keyed" or (cfg.sampling == "auto" and gpus > 1) else
                           torch.Generator(device=self.device).manual_seed(cfg.seed * 1000 + 1))
        self.shuffle_gen = torch.Generator().manual_seed(cfg.seed * 1000 + 2)
        self.buffer: list[Sequence] = []
        self.next_uid = 0
        self.step = 0  # number of completed PPO steps == policy version
        self.wall_s = 0.0
        self.deferral_counts: Counter = Counter()
        self.frozen_actor: torch.nn.Module | None = None
        self.checkpoints: list[Path] = []
        #: the eval gate's per-prompt records by step (this process's gates and extensions), the extension batches
        #: each step has had, the extra prompt evaluations spent, and the weights kept for `extend_gate`
        self.gate_records: dict[int, list[PromptRecord]] = {}
        self.gate_extended: dict[int, int] = {}
        self.extra_evals = 0
        self._gate_weights: dict[int, dict] = {}
        if self.out_dir and resume:
            ckpt = latest_checkpoint(self.out_dir)
            if ckpt is not None:
                self._say(f"resuming from {ckpt}")
                self.load_checkpoint(ckpt)

    def tenant_pool(self):
        """The job's pool of tenant-code processes (training/inputs/tenant_code.py), started on first use; `close` stops
        it (the trainer's run does at its end; a later call starts a fresh one)."""
        if self._pool is None:
            from pathlib import Path as _Path

            from training.inputs.tenant_code import TenantFunctionPool

            workers = self.cfg.reward.workers if self.cfg.reward.kind == "function" else 1
            memory = max(s.memory_mb for s in (self.cfg.reward, self.cfg.gate) if s.kind == "function")
            cwd = _Path(self.cfg.config_dir) if self.cfg.config_dir else _Path.cwd()
            self._pool = TenantFunctionPool(cwd, workers=workers, memory_mb=memory)
        return self._pool

    def close(self) -> None:
        """Stop the tenant-code processes (idempotent)."""
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    def autocast(self):
        """The forward passes' precision (training/job/device.py): bfloat16 autocast on the job's device, or none."""
        return autocast(self.device, self.cfg.dtype)

    def _say(self, msg: str) -> None:
        if self.progress:
            self.progress(msg)

    # ---- one step -------------------------------------------------------------------------------
    def _fill_buffer(self, units: int) -> None:
        """Draw prompts until `units` units are in flight (groups for grpo/rloo, completions for ppo)."""
        have = len({s.group for s in self.buffer}) if self.grouped else len(self.buffer)
        while have < units:
            new = self._new_unit()
            self.buffer += new
            have += 1 if self.grouped else len(new)

    def _new_unit(self) -> list[Sequence]:
        """One freshly drawn prompt: `group_size` sequences of it."""
        row = int(self.prompt_rng.integers(self.inputs.n_train))
        prompt = self.inputs.prompt("train", row)
        ids = self.tok.encode(self.inputs.render(prompt))
        group = self.next_uid
        unit = []
        for _ in range(self.group_size):
            unit.append(Sequence(uid=self.next_uid, group=group, prompt=prompt, prompt_ids=ids,
                                 enqueued_step=self.step, row=row))
            self.next_uid += 1
        return unit

    def _fault_active(self, kind: str) -> bool:
        return self.cfg.fault.kind == kind and self.step >= self.cfg.fault.at_step

    def _sync(self) -> float:
        t = time.perf_counter()
        if self._fault_active("frozen_sync"):
            if self.frozen_actor is None:
                self.frozen_actor = frozen_copy(self.actor)
                self.frozen_version = self.step
            self.engine.sync(self.frozen_actor, self.frozen_version)
        else:
            self.engine.sync(self.actor, self.step)
        if hasattr(self.engine, "temperature"):  # behaviour_mismatch: the engine samples at another temperature
            mult = self.cfg.fault.factor if self._fault_active("behaviour_mismatch") else 1.0
            self.engine.temperature = self.cfg.ppo.temperature * mult
        return time.perf_counter() - t

    def _score(self, sample: Sample) -> float:
        score = sample.score
        if self._fault_active("constant_reward"):
            score = 0.0
        elif self._fault_active("nan_reward"):
            score = float("nan")
        elif self._fault_active("gameable_reward"):
            text = self.tok.decode(sample.seq.response_ids)
            score += self.cfg.fault.bonus * text.count(self.cfg.fault.trigger)
        return score

    def _function_rewards(self, samples: list[Sample]) -> tuple[list[Sample], float, float]:
        """Score the step's finished samples with the reward function (in its processes): each sample's score is
        what it returned; a sample it raised on or gave None has no reward: under ppo it is left out of the update,
        under grpo/rloo it stays in its group with advantage 0 (NaN score). More than
        `reward.max_error_frac` of the batch raising fails the job (TenantCodeError, a tenant code fault). Returns
        the samples kept, the call's wall seconds (the `reward_fn` phase) and the CPU seconds it used."""
        prompts = [s.seq.prompt for s in samples]
        texts = [self.tok.decode(s.seq.response_ids) for s in samples]
        got = self.reward_fn(prompts, texts, self.inputs.columns("train", [s.seq.row for s in samples]),
                             [list(s.seq.response_ids) for s in samples], self.step, self.cfg.steps)
        self._reward_metrics = got.metrics
        for s, score in zip(samples, got.scores, strict=True):
            s.score = NAN if score is None else float(score)
        scored = [s for s in samples if np.isfinite(s.score)]
        self._no_score_frac = 1.0 - len(scored) / max(1, len(samples))
        # ppo: a sample with no score is left out; a group keeps it (its advantage is 0 and the others' baseline
        # leaves it out: training/algorithms/core_algos.py group_advantages, as TRL does), so every trained group is
        # whole
        kept = samples if self.grouped else scored
        if not scored:
            from eval.attribution import TenantCodeError

            raise TenantCodeError(f"your reward function {self.reward_fn.text} scored none of the {len(samples)} "
                                  f"samples of step {self.step + 1} (every score None or raised): nothing to train on")
        return kept, got.wall_s, got.cpu_s

    def run(self, steps: int | None = None) -> Iterator[StepRecord]:
        """Train until `steps` total steps (default: config.steps); yields one record per step."""
        total = steps if steps is not None else self.cfg.steps
        writes = self.out_dir is not None and self.world.is_main and (self._rendezvous is None
                                                                      or self._rendezvous.rank == 0)
        writer = MetricsCSV(self.out_dir / "metrics.csv", self.step) if writes else None
        self._gate_csv = GateRecordsCSV(self.out_dir / GATE_RECORDS, self.step) if writes else None
        finished = False
        try:
            self._join_ranks(total)
            if self.apart is not None:
                self.apart.start(self.world)
            while self.step < total:
                try:
                    record = self.train_step()
                except torch.OutOfMemoryError as err:  # the job fails with this reason; its checkpoints stay
                    ckpt = latest_checkpoint(self.out_dir) if self.out_dir else None
                    raise out_of_memory(err, self.device, self.step + 1, ckpt) from err
                except Exception as err:  # a collective failed: a rank died, hung or raised (named in one line)
                    named = self._ranks.failure(err, self.step + 1) if self._ranks is not None else None
                    if named is None:
                        raise
                    raise named from err
                if writer:
                    writer.write(record)
                if writes and (self.step % self.cfg.checkpoint_every == 0 or self.step == total):
                    self.save_checkpoint()
                yield record
            finished = True
        finally:
            self.close()
            if self.apart is not None:
                self.apart.close()
            if self._ranks is not None:
                self._ranks.close(finished)
                self._ranks, self.world = None, LOCAL
            if writer:
                writer.close()
            if writes:
                self._write_summary()

    def _join_ranks(self, total: int) -> None:
        """A job on several ranks: join the group (rank 0 without a group spawns the others first) and start from
        rank 0's weights."""
        if self.gpus == 1:
            return
        if self._rendezvous is not None:
            self.world = self._rendezvous.connect(self.device)
        elif self.world.size == 1:
            self._ranks = LocalRanks(self, total)
            self.world = self._ranks.world
        self._broadcast_weights()

    def train_step(self) -> StepRecord:
        cfg = self.cfg
        t_start = time.perf_counter()
        ranks = self.world.size > 1
        if ranks:
            self._rank_fault()
        phases = {"rollout": 0.0, "score": 0.0, "sync": 0.0, "optim": 0.0, "eval": 0.0}
        phases["sync"] = self._sync()
        if self.apart is not None:
            self.apart.step = self.step + 1  # named in a failure's line
        delta = self.delta_ctl.delta
        continuous = isinstance(self.engine, ContinuousEngine)
        if not continuous:  # the full-batch engine draws prompts as its rows free up
            self._fill_buffer(self.units_per_step + delta)
        chunk = self.tuner.chunk_for_step(self.step) if self.stream else cfg.ppo.max_new_tokens
        # torch's thread count is per process: set it every step, so trainers sharing a process (the bench's
        # interleaved runs) each run with their own setting; decode and scorer thread get one core each
        torch.set_num_threads(1 if self.stream else self.threads)
        try:
            with self.autocast():
                if ranks:  # this rank's share (training/distributed/ranks.py)
                    out = self._rollout_ranks(chunk)
                elif continuous:
                    out = continuous_rollout(
                        self.engine, self.scorers, self.buffer, self._new_unit,
                        slots=(self.units_per_step + delta) * (self.group_size if self.grouped else 1),
                        pad_id=self.tok.pad_id,
                        units_needed=self.units_per_step, max_new_tokens=cfg.ppo.max_new_tokens,
                        generator=self.sample_gen, grouped=self.grouped, group_size=self.group_size,
                        score_at_once=self.stream, scorer_threads=1,
                    )
                else:
                    out = rollout(
                        self.engine, self.scorers, self.buffer, pad_id=self.tok.pad_id,
                        units_needed=self.units_per_step, max_new_tokens=cfg.ppo.max_new_tokens, chunk_size=chunk,
                        stream=self.stream, generator=self.sample_gen, grouped=self.grouped, scorer_threads=1,
                        device=self.device, apart=self.apart,
                    )
        finally:
            torch.set_num_threads(self.threads)
        samples = out.samples
        if self.reward_fn is not None and (samples or not ranks):  # on several ranks: each its own, in its own pool
            samples, phases["reward_fn"], record_cpu = self._function_rewards(samples)
        else:
            record_cpu = 0.0
        if ranks:  # the step's samples and deferred units, in uid order, on every rank
            samples, out, self._no_score_frac, record_cpu = self._gather_step(
                samples, out, (round((1 - self._no_score_frac) * len(out.samples)), len(out.samples)), record_cpu)
        phases["rollout"], phases["score"] = out.decode_s, out.score_s
        if self.stream and not continuous:
            self.tuner.report(chunk, out.decode_s + out.score_s, out.tokens_generated)
        self.buffer = out.deferred
        if self._fault_active("duplicated_carry"):
            for s in self.buffer:  # the carried tokens appended twice, within the length budget
                keep = max(len(s.response_ids), min(2 * len(s.response_ids), cfg.ppo.max_new_tokens - 1))
                s.response_ids = (s.response_ids * 2)[:keep]
                s.versions = (s.versions * 2)[:keep]
                s.behav_logprobs = (s.behav_logprobs * 2)[:keep]
        if self.grouped:  # keep group members adjacent for group advantages
            samples = sorted(samples, key=lambda s: (s.seq.group, s.seq.uid))
        for s in samples:
            self.deferral_counts[self.step - s.seq.enqueued_step] += 1
        self.last_response_lengths = [len(s.seq.response_ids) for s in samples]
        carried = [len(s.seq.response_ids) for s in samples if s.seq.enqueued_step < self.step]
        fresh = [len(s.seq.response_ids) for s in samples if s.seq.enqueued_step >= self.step]

        t = time.perf_counter()
        stats = self._ppo_update(samples)
        phases["optim"] = time.perf_counter() - t
        self.step += 1

        scores = np.array([st for st in stats.pop("scores")])
        got = scores[np.isfinite(scores)]  # a group member with no score is trained with advantage 0, not averaged
        record = StepRecord(step=self.step, policy_version=self.step,
                            reward_mean=float(np.mean(got)) if len(got) else NAN,
                            reward_std=float(np.std(got)) if len(got) else NAN, **stats)
        texts = [self.tok.decode(s.seq.response_ids) for s in samples]
        record.response_len_mean = float(np.mean([len(s.seq.response_ids) for s in samples]))
        record.truncation_rate = float(np.mean([s.seq.truncated for s in samples]))
        record.unparseable_rate = (float(np.mean([not parseable(x) for x in texts])) if self.inputs.kind == "synthetic"
                                   else float(self._no_score_frac))
        record.tokens_generated = out.tokens_generated
        record.samples_trained = len(samples)
        record.delta = delta
        record.chunk_size = chunk if self.stream and not continuous else 0
        record.deferred = len(self.buffer)
        record.decode_steps = out.decode_steps
        record.len_carried_mean = float(np.mean(carried)) if carried else NAN
        record.len_fresh_mean = float(np.mean(fresh)) if fresh else NAN
        record.reward_fn_cpu_s = record_cpu
        record.reward_fn_metrics = dict(self._reward_metrics) if self.reward_fn is not None else {}
        if self.step % cfg.eval_every == 0 and self.world.is_main:  # rank 0 alone gates
            t = time.perf_counter()
            ev = self.gate()  # at the job's dtype (gold_eval's autocast)
            record.gold_eval, record.gold_eval_se = ev.mean, ev.se
            phases["eval"] = time.perf_counter() - t
        self.delta_ctl.update(record.reward_mean)
        record.world_size = self.world.size
        if ranks:
            phases, record.rank_idle_s = self._phases_over_ranks(phases)
        record.phase_seconds = phases
        self.wall_s += time.perf_counter() - t_start
        record.wall_s = self.wall_s
        return record


def train(config: TrainConfig, overlap: str = "full", out_dir: str | Path | None = None, steps: int | None = None,
          resume: bool = True, progress=None) -> Iterator[StepRecord]:
    """Run PPO with the chosen overlap; yields one StepRecord per step (see module docstring)."""
    yield from Trainer(config, overlap, out_dir, resume=resume, progress=progress).run(steps)
