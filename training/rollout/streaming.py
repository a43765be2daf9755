"""One rollout: the actor decodes, the scorers score, with or without intra-step streaming.

Sequential (no streaming): decode until the needed units finish, then run the reference, critic and
reward model over the finished rows in one pass each (the "score" phase).

Streaming (OPPO intra-step overlap): the actor thread decodes and hands every C-token chunk to a
scorer thread through a queue; the scorer thread prefills the chunk into each scorer's own KV cache
while the actor decodes the next chunk. When decoding stops, only the last chunk is left to score.
Torch releases the GIL inside its kernels, so the two threads really do run on the two cores.

A "unit" is one sequence (PPO) or one group of `group_size` sequences of the same prompt (GRPO/RLOO);
decoding stops once `units_needed` units are finished (inter-step overlap asks for B of B+Delta), and
the first units to finish are the ones trained on. The rest come back as `deferred` with the tokens
they have so far; the next step re-prefills them under the new weights (recompute, not a stale cache).
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass, field

import torch

from training.rollout.engine import GenerationEngine, IncrementalScorer, KeyedDraws, _units_done, left_pad


@dataclass
class Sequence:
    """One prompt in flight; survives across steps while deferred."""

    uid: int
    group: int
    prompt: str
    prompt_ids: list[int]
    enqueued_step: int
    response_ids: list[int] = field(default_factory=list)
    #: the prompt's row in the job's train split (training/inputs/job_inputs.py: its columns reach a reward function)
    row: int = -1
    versions: list[int] = field(default_factory=list)  # policy version that generated each token
    #: log pi_behav(token) under the weights that sampled it (the off-policy correction's denominator)
    behav_logprobs: list[float] = field(default_factory=list)
    finished: bool = False
    truncated: bool = False
    #: the rank that holds it (a job on several ranks, training/distributed/): a carried unit stays on its rank;
    #: -1 until one is given
    rank: int = -1


@dataclass
class Sample:
    """A finished sequence with everything PPO needs (token-aligned tensors of length T)."""

    seq: Sequence
    #: log pi(token) under the engine's weights at the start of this step: a carried token is re-prefilled,
    #: so this is the proximal policy's log-prob, not the one it was sampled with (`behav_logprobs`)
    old_logprobs: torch.Tensor
    #: log pi_ref(token); None when the job builds no reference model (no KL paid)
    ref_logprobs: torch.Tensor | None
    values: torch.Tensor | None
    score: float
    #: log pi_behav(token) as sampled (equal to `old_logprobs` for tokens generated in this step)
    behav_logprobs: torch.Tensor | None = None
    #: the decode step of its rollout at which its unit finished (-1: before the rollout): ranks choose the first
    #: units to finish over all ranks by it
    finish_step: float = -1.0


@dataclass
class RolloutResult:
    samples: list[Sample]
    deferred: list[Sequence]
    tokens_generated: int
    decode_s: float
    score_s: float
    decode_steps: int


class _ScorerThread:
    """Consumes (ids, mask) chunks for a set of scorers on a second thread; collects their outputs."""

    def __init__(self, scorers: dict[str, IncrementalScorer], threads: int):
        self.scorers, self.threads = scorers, threads
        self.outputs: dict[str, list[torch.Tensor]] = {k: [] for k in scorers}
        self.q: queue.Queue = queue.Queue()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True, name="oppo-scorer")
        self.thread.start()

    def _run(self) -> None:
        torch.set_num_threads(self.threads)
        first = True
        try:
            while (item := self.q.get()) is not None:
                ids, mask = item
                for name, scorer in self.scorers.items():
                    out = scorer.begin(ids, mask) if first else scorer.extend(ids, mask)
                    self.outputs[name].append(out)
                first = False
        except BaseException as err:  # surfaced by finish()
            self.error = err
            while self.q.get() is not None:  # drain so the producer never blocks
                pass

    def put(self, ids: torch.Tensor, mask: torch.Tensor) -> None:
        self.q.put((ids, mask))

    def stop(self) -> None:
        """End the thread without its outputs (the rollout failed): it finishes the chunk in hand and exits."""
        self.q.put(None)
        self.thread.join()

    def finish(self) -> dict[str, torch.Tensor]:
        self.stop()
        if self.error is not None:
            raise self.error
        for s in self.scorers.values():
            s.release()
        return {k: torch.cat(v, 1) for k, v in self.outputs.items()}


def rollout(
    engine: GenerationEngine,
    scorers: dict[str, IncrementalScorer],
    seqs: list[Sequence],
    *,
    pad_id: int,
    units_needed: int,
    max_new_tokens: int,
    chunk_size: int,
    stream: bool,
    generator: torch.Generator,
    grouped: bool = False,
    scorer_threads: int = 1,
    device: torch.device | str = "cpu",
    until=None,
    apart=None,
) -> RolloutResult:
    """Generate until `units_needed` units are finished; score them; return samples and deferred rest.

    `scorers` maps "ref" (logprob), "critic" (value, optional) and "reward" (reward) to scorers. The batch is built on
    `device` (the models' and the generator's); the samples' tensors come back on the CPU. `generator`: a
    torch.Generator, or `KeyedDraws` (draws keyed by sample and position). `until` (ranks: `TransformersEngine.until`):
    the stop is decided over all ranks, every decode step; the units this rank finished by then are all returned
    (up to `units_needed`), each with its `finish_step`, and the caller chooses the first ones over all ranks.
    `apart` (`placement: reward_apart`, training/distributed/apart.py): scorers in another process, fed the same
    columns through `apart.session()` (`put` each chunk, `finish` for the outputs) as the local scorer thread is.
    """
    n = len(seqs)
    if isinstance(generator, KeyedDraws):
        generator = generator.rows([s.uid for s in seqs])
    ids, attn = left_pad([s.prompt_ids + s.response_ids for s in seqs], pad_id)
    width = ids.shape[1]
    resp_cols = torch.zeros_like(attn, dtype=torch.bool)
    for i, s in enumerate(seqs):
        if s.response_ids:
            resp_cols[i, width - len(s.response_ids) :] = True
    done = torch.tensor([s.finished for s in seqs], dtype=torch.bool)
    n_resp = torch.tensor([len(s.response_ids) for s in seqs], dtype=torch.long)
    groups = None
    if grouped:
        remap = {g: k for k, g in enumerate(dict.fromkeys(s.group for s in seqs))}
        groups = torch.tensor([remap[s.group] for s in seqs], dtype=torch.long)
    ids, attn, resp_cols, done, n_resp = (t.to(device) for t in (ids, attn, resp_cols, done, n_resp))
    groups = groups.to(device) if groups is not None else None

    t0 = time.perf_counter()
    # streaming: every chunk goes to the local scorer thread and, apart, to the scorer process
    sinks = []
    if stream:
        if scorers or apart is None:
            sinks.append(_ScorerThread(scorers, scorer_threads))
        if apart is not None:
            sinks.append(apart.session())
    try:
        for sink in sinks:
            sink.put(ids, attn)
        actor_lp = [engine.begin(ids, attn, done, n_resp, max_new_tokens, generator)]
        all_ids, all_attn, all_resp = [ids], [attn], [resp_cols]
        finish_time = torch.where(done, torch.full((n,), -1.0, device=device),
                                  torch.full((n,), float("inf"), device=device))
        col = 0
        engine.until = until
        while (not engine.stopped if until is not None else
               _units_done(engine.done, groups) < units_needed and not bool(engine.done.all())):
            chunk = engine.decode(chunk_size, units_needed, groups)
            c = chunk.ids.shape[1]
            if c == 0:
                if until is None or engine.stopped:
                    break
                continue  # idle on this rank until the ranks stop together
            for sink in sinks:
                sink.put(chunk.ids, chunk.mask)
            fin = chunk.finish_col >= 0
            finish_time[fin] = (col + chunk.finish_col[fin]).float()
            col += c
            all_ids.append(chunk.ids)
            all_attn.append(chunk.mask)
            all_resp.append(chunk.mask.bool())
            actor_lp.append(chunk.logprobs)
        engine.release()
        t1 = time.perf_counter()
    except BaseException:
        # a scorer that failed mid-stream (the scorer process gone) ends the rollout here; the local scorer thread is
        # stopped and joined first: a daemon thread still inside a torch op when the interpreter exits aborts the
        # process ("terminate called without an active exception", exit -6)
        for sink in sinks:
            if isinstance(sink, _ScorerThread):
                sink.stop()
        raise

    ids, attn, resp = torch.cat(all_ids, 1), torch.cat(all_attn, 1), torch.cat(all_resp, 1)
    actor_lp_t = torch.cat(actor_lp, 1)
    # the bookkeeping below reads single elements: on the CPU, one copy each
    ids, attn, resp, actor_lp_t, finish_time = (t.cpu() for t in (ids, attn, resp, actor_lp_t, finish_time))
    groups = groups.cpu() if groups is not None else None
    new_tokens = ids[:, width:]
    new_mask = attn[:, width:]
    new_lp = actor_lp_t[:, width:]
    final_done = engine.done.cpu()

    # Which units train: the first `units_needed` to finish (ties broken by row order).
    if groups is None:
        unit_of_row = torch.arange(n)
        unit_time = finish_time
    else:
        unit_of_row = groups
        unit_time = torch.full((int(groups.max()) + 1,), -1.0).scatter_reduce(0, groups, finish_time, "amax")
    order = sorted(range(unit_time.shape[0]), key=lambda u: (float(unit_time[u]), u))
    chosen_units = [u for u in order if torch.isfinite(unit_time[u])][:units_needed]
    chosen_set = set(chosen_units)
    rows = [i for i in range(n) if int(unit_of_row[i]) in chosen_set]

    # Update every sequence with what it generated this step.
    for i, s in enumerate(seqs):
        m = new_mask[i].bool()
        toks = new_tokens[i][m].tolist()
        s.response_ids += toks
        s.versions += [engine.version] * len(toks)
        s.behav_logprobs += new_lp[i][m].tolist()
        if bool(final_done[i]) and not s.finished:
            s.finished = True
            s.truncated = not s.response_ids or s.response_ids[-1] != getattr(engine, "eos_id", -1)

    if stream:
        outs = {}
        for sink in sinks:
            outs.update(sink.finish())
        outs = {k: v.cpu()[rows] for k, v in outs.items()}
        sel_ids, sel_attn, sel_resp, sel_lp = ids[rows], attn[rows], resp[rows], actor_lp_t[rows]
    else:
        sel_ids, sel_attn, sel_resp, sel_lp = ids[rows], attn[rows], resp[rows], actor_lp_t[rows]
        keep = sel_attn.any(0).nonzero()
        first_col = int(keep[0]) if len(keep) else 0
        sel_ids, sel_attn = sel_ids[:, first_col:], sel_attn[:, first_col:]
        sel_resp, sel_lp = sel_resp[:, first_col:], sel_lp[:, first_col:]
        outs = {}
        if rows:
            remote = apart.session() if apart is not None else None
            if remote is not None:  # sent first: the scorer process works while the local scorers do
                remote.put(sel_ids, sel_attn)
            for name, scorer in scorers.items():
                outs[name] = scorer.begin(sel_ids.to(device), sel_attn.to(device)).cpu()
                scorer.release()
            if remote is not None:
                outs.update(remote.finish())
    t2 = time.perf_counter()

    samples = []
    for k, i in enumerate(rows):
        cols = sel_resp[k].nonzero().squeeze(-1)
        last = int(sel_attn[k].nonzero().max())
        samples.append(Sample(
            seq=seqs[i],
            old_logprobs=sel_lp[k, cols],
            ref_logprobs=outs["ref"][k, cols] if "ref" in outs else None,  # no reference model: no KL
            values=outs["critic"][k, cols] if "critic" in outs else None,
            # no reward model: a reward function scores the finished samples after the rollout (training/trainer.py)
            score=float(outs["reward"][k, last]) if "reward" in outs else float("nan"),
            behav_logprobs=_behav(seqs[i], sel_lp[k, cols]),
            finish_step=float(unit_time[int(unit_of_row[i])]),
        ))
    chosen_rows = set(rows)
    deferred = [s for i, s in enumerate(seqs) if i not in chosen_rows]
    return RolloutResult(
        samples=samples, deferred=deferred, tokens_generated=int(new_mask.sum()),
        decode_s=t1 - t0, score_s=t2 - t1, decode_steps=col,
    )


def _behav(seq: Sequence, old_logprobs: torch.Tensor) -> torch.Tensor:
    """The sampled log-probs of a finished sequence; a sequence restored from a checkpoint written before they
    were recorded has none, and falls back to the re-prefilled ones (no correction for it)."""
    if len(seq.behav_logprobs) != len(seq.response_ids):
        return old_logprobs.clone()
    return torch.tensor(seq.behav_logprobs, dtype=old_logprobs.dtype)
