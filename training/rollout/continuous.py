"""A rollout engine that keeps its decode batch full: a finished row's slot takes the next sequence at once.

Why: on a GPU a decode step costs about the same for 1 row or 128 (issue 38's H200 anchor: 57-65 ms flat), so a
batch that waits on its one long answer with the other rows finished wastes most of its steps. The chunked loop
of training/rollout/engine.py keeps finished rows as pad columns until the batch stops; this loop gives every finished
row's slot to the next sequence (a carried one first, then a freshly drawn prompt) before the next step.

Layout: one `DynamicCache` of `slots` rows, all of one width W. A sequence entering a slot is prefilled on its own
(with the other entrants of that step, left-padded among themselves) and its keys/values are written right-aligned
into the slot's row, the rest of the row zeroed and masked. Positions come from each row's own count of real
tokens, so a row's position ids do not depend on W or on what the slot held before. A free slot (no sequence)
feeds a pad token that attends only to itself, so it never blocks trimming: after each step the columns no row
attends to any more are cut from the left, which keeps W at most the longest live sequence. When the source of
sequences runs dry the free rows leave the batch.

Log-probs: the engine records log pi(token) under its weights at its temperature for every sampled token (the
behaviour log-probs) and, for a carried sequence, the re-prefilled log-probs of its carried tokens (the proximal
ones, as `TransformersEngine.begin` does).

`continuous_rollout` is the inter-step overlap on this engine: `slots` = (B + Delta) sequences in flight, carried
sequences admitted first, then prompts drawn as slots free; it stops once `units_needed` units have finished and
trains on the first ones to finish; the sequences still in flight come back as `deferred` with their tokens so far
(re-prefilled under the next step's weights, as in training/rollout/streaming.py). With `score_at_once` the finished
responses go to a scorer thread in batches of a quarter of the units needed, in finish order, each batch as soon as
it is complete, so when the last needed one finishes only the last quarter is left to score (fixed batches, not
whatever is waiting: scores must not depend on thread timing, or a resumed run would not repeat the uninterrupted
one); without, the chosen ones are scored in one pass after decoding.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from transformers import DynamicCache

from training.rollout.engine import IncrementalScorer, left_pad
from training.rollout.streaming import RolloutResult, Sample, Sequence, _behav


@dataclass
class Entrant:
    """A sequence offered to the engine: its prefix (prompt + carried response) and how much of it is response."""

    key: int
    prefix: list[int]
    n_carried: int
    done: bool = False


@dataclass
class Exit:
    """What one sequence did in the engine."""

    key: int
    #: log pi(carried token) re-prefilled under the engine's weights (empty when nothing was carried)
    carried_logprobs: list[float]
    tokens: list[int] = field(default_factory=list)
    #: log pi(token) at sampling, under the engine's weights and temperature
    logprobs: list[float] = field(default_factory=list)
    finished: bool = False
    #: decode step at which it finished (-1: finished before this rollout), None while unfinished
    finish_step: int | None = None


class ContinuousEngine:
    """KV-cached sampling loop that refills finished rows with new sequences at every decode step."""

    def __init__(self, eos_id: int, pad_id: int, temperature: float = 1.0, greedy: bool = False,
                 refill_min: int = 1):
        self.eos_id, self.pad_id, self.temperature, self.greedy = eos_id, pad_id, temperature, greedy
        #: refill only once this many slots are free (or no row is live): each refill round is one prefill forward,
        #: which on a GPU costs about a decode step, so batching the refills trades a little occupancy for fewer
        #: forwards
        self.refill_min = refill_min
        self.model: torch.nn.Module | None = None
        self.version = 0
        #: model forward calls so far (prefills of entrants + decode steps): on a GPU each costs about one step
        self.forwards = 0

    def sync(self, actor: torch.nn.Module, version: int) -> None:
        self.model, self.version = actor, version

    def _device(self) -> torch.device:
        return next(self.model.parameters()).device

    @torch.no_grad()
    def run(self, source: Callable[[], Entrant | None], slots: int, max_new_tokens: int,
            generator: torch.Generator | None, on_exit: Callable[[Exit], bool]) -> tuple[list[Exit], int]:
        """Decode until `source` is dry and every row is finished, or until `on_exit` (called for each sequence as
        it finishes) returns True. Returns (the exits of the sequences still in flight at the stop, decode steps)."""
        if slots < 1:
            raise ValueError(f"slots must be at least 1, got {slots}")
        dev = self._device()
        self.cache: DynamicCache | None = None
        self.attn = torch.zeros((0, 0), dtype=torch.long, device=dev)
        rows: list[Exit | None] = []  # per slot: the sequence in it, None when free
        n_resp: list[int] = []
        count = torch.zeros(0, dtype=torch.long, device=dev)
        next_logits: torch.Tensor | None = None
        dry = False
        steps = 0
        while True:
            # 1. fill free slots (a finished carried sequence only needs its prefill, not a slot)
            free = [r for r, x in enumerate(rows) if x is None] + list(range(len(rows), slots))
            entrants: list[tuple[int | None, Entrant]] = []
            admit = len(free) >= min(self.refill_min, slots) or all(x is None for x in rows)
            while admit and free and not dry:
                e = source()
                if e is None:
                    dry = True
                elif e.done:
                    entrants.append((None, e))
                else:
                    entrants.append((free.pop(0), e))
            if entrants:
                need = max([s for s, _ in entrants if s is not None], default=-1) + 1
                if need > len(rows):  # grow the batch to the slots now in use
                    grow = need - len(rows)
                    rows += [None] * grow
                    n_resp += [0] * grow
                    count = torch.cat([count, torch.zeros(grow, dtype=torch.long, device=dev)])
                    self._grow(grow)
                    if next_logits is not None:
                        next_logits = torch.cat([next_logits, next_logits.new_zeros(grow, next_logits.shape[1])])
                stop = False
                lp_prefix, last, tmp, tmp_attn = self._prefill([e.prefix for _, e in entrants], dev)
                live = [k for k, (s, _) in enumerate(entrants) if s is not None]
                if live:
                    live_slots = [entrants[k][0] for k in live]
                    self._splice(tmp, tmp_attn, live, live_slots)
                    if next_logits is None:
                        next_logits = last.new_zeros(len(rows), last.shape[1])
                    next_logits[live_slots] = last[live]
                    count[live_slots] = tmp_attn[live].sum(1)
                for k, (s, e) in enumerate(entrants):
                    carried = lp_prefix[k, lp_prefix.shape[1] - e.n_carried :].tolist() if e.n_carried else []
                    ex = Exit(e.key, carried)
                    if s is None:
                        ex.finished, ex.finish_step = True, -1
                        stop = on_exit(ex) or stop
                    else:
                        rows[s], n_resp[s] = ex, e.n_carried
                if stop:
                    return self._stop(rows), steps
            active = [r for r, x in enumerate(rows) if x is not None]
            if not active:
                if dry:
                    return [], steps
                continue
            if dry and len(active) < len(rows):  # nothing left to admit: free rows leave the batch
                idx = torch.tensor(active, device=dev)
                self.cache.batch_select_indices(idx)
                self.attn, count, next_logits = self.attn[idx], count[idx], next_logits[idx]
                rows = [rows[r] for r in active]
                n_resp = [n_resp[r] for r in active]
                active = list(range(len(rows)))

            # 2. sample one token for every live row
            logp = torch.log_softmax(next_logits, -1)
            if self.greedy:
                tok = logp.argmax(-1)
            else:
                tok = torch.multinomial(logp.exp(), 1, generator=generator).squeeze(-1)
            tok_lp = logp.gather(-1, tok[:, None]).squeeze(-1)
            toks, lps = tok.tolist(), tok_lp.tolist()
            stop = False
            for r in active:
                ex = rows[r]
                ex.tokens.append(toks[r])
                ex.logprobs.append(lps[r])
                n_resp[r] += 1
                if toks[r] == self.eos_id or n_resp[r] >= max_new_tokens:
                    ex.finished, ex.finish_step = True, steps
                    rows[r] = None
                    stop = on_exit(ex) or stop
            steps += 1
            if stop:
                return self._stop(rows), steps

            # 3. feed the sampled tokens (free rows feed a pad that attends only to itself)
            live = torch.tensor([x is not None for x in rows], device=dev)
            if not bool(live.any()):
                if dry:
                    return [], steps
                continue  # every row finished this step: refill before feeding anything
            feed = torch.where(live, tok, torch.full_like(tok, self.pad_id))
            self.attn[~live] = 0
            self.attn = torch.cat([self.attn, torch.ones_like(self.attn[:, :1])], 1)
            pos = torch.where(live, count, torch.zeros_like(count))[:, None]
            count = count + live.long()
            self.forwards += 1
            out = self.model(input_ids=feed[:, None], attention_mask=self.attn, position_ids=pos,
                             past_key_values=self.cache, use_cache=True)
            next_logits = out.logits[:, -1].float() / self.temperature
            self._trim()

    def _prefill(self, prefixes: list[list[int]], dev: torch.device):
        ids, attn = left_pad(prefixes, self.pad_id)
        ids, attn = ids.to(dev), attn.to(dev)
        tmp = DynamicCache()
        pos = (attn.cumsum(1) - 1).clamp(min=0)
        self.forwards += 1
        logits = self.model(input_ids=ids, attention_mask=attn, position_ids=pos, past_key_values=tmp,
                            use_cache=True).logits.float() / self.temperature
        lp = torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
        return lp, logits[:, -1], tmp, attn

    def _grow(self, grow: int) -> None:
        self.attn = torch.cat([self.attn, self.attn.new_zeros(grow, self.attn.shape[1])])
        if self.cache is not None:
            for layer in self.cache.layers:
                layer.keys = torch.cat([layer.keys, layer.keys.new_zeros((grow,) + layer.keys.shape[1:])])
                layer.values = torch.cat([layer.values, layer.values.new_zeros((grow,) + layer.values.shape[1:])])

    def _splice(self, tmp: DynamicCache, tmp_attn: torch.Tensor, src: list[int], slots: list[int]) -> None:
        """Write rows `src` of a fresh prefill cache right-aligned into the batch's rows `slots`."""
        p = tmp_attn.shape[1]
        n = self.attn.shape[0]
        if self.cache is None:
            self.cache = tmp
            for layer in self.cache.layers:
                k, v = layer.keys, layer.values
                layer.keys = k.new_zeros((n,) + k.shape[1:])
                layer.values = v.new_zeros((n,) + v.shape[1:])
                layer.keys[slots], layer.values[slots] = k[src], v[src]
            self.attn = tmp_attn.new_zeros(n, p)
            self.attn[slots] = tmp_attn[src]
            return
        w = self.attn.shape[1]
        if p > w:  # widen on the left with masked columns
            self.attn = torch.cat([self.attn.new_zeros(n, p - w), self.attn], 1)
            for layer in self.cache.layers:
                for name in ("keys", "values"):
                    t = getattr(layer, name)
                    setattr(layer, name, torch.cat([t.new_zeros(t.shape[:2] + (p - w,) + t.shape[3:]), t], 2))
            w = p
        for lm, lt in zip(self.cache.layers, tmp.layers, strict=True):
            for name in ("keys", "values"):
                main, new = getattr(lm, name), getattr(lt, name)
                row = main.new_zeros((len(slots),) + main.shape[1:])
                row[:, :, w - p :] = new[src]
                main[slots] = row
        row = self.attn.new_zeros(len(slots), w)
        row[:, w - p :] = tmp_attn[src]
        self.attn[slots] = row

    def _trim(self) -> None:
        used = self.attn.any(0).nonzero()
        first = int(used[0]) if len(used) else self.attn.shape[1]
        if first > 0:
            self.attn = self.attn[:, first:]
            for layer in self.cache.layers:
                layer.keys, layer.values = layer.keys[:, :, first:], layer.values[:, :, first:]

    def _stop(self, rows: list[Exit | None]) -> list[Exit]:
        self.cache = None
        return [x for x in rows if x is not None]

    def release(self) -> None:
        self.cache = None


class _FinishedScorer:
    """Scores batches of finished sequences on a second thread, one pass per batch in the order they are put. The
    batches are fixed by finish order (not by what happens to be waiting), so the scores do not depend on thread
    timing and a run is reproducible."""

    def __init__(self, scorers: dict[str, IncrementalScorer], pad_id: int, threads: int):
        self.scorers, self.pad_id, self.threads = scorers, pad_id, threads
        self.out: dict[int, dict[str, torch.Tensor | float]] = {}
        self.q: queue.Queue = queue.Queue()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True, name="continuous-scorer")
        self.thread.start()

    def _run(self) -> None:
        torch.set_num_threads(self.threads)
        while (batch := self.q.get()) is not None:
            if self.error is None:
                try:
                    self.out.update(score_sequences(self.scorers, batch, self.pad_id))
                except BaseException as err:  # surfaced by finish()
                    self.error = err

    def put(self, seqs: list[Sequence]) -> None:
        self.q.put(list(seqs))

    def finish(self) -> dict[int, dict[str, torch.Tensor | float]]:
        self.q.put(None)
        self.thread.join()
        if self.error is not None:
            raise self.error
        return self.out


def score_sequences(scorers: dict[str, IncrementalScorer], seqs: list[Sequence],
                    pad_id: int) -> dict[int, dict[str, torch.Tensor | float]]:
    """Reference log-probs, critic values (per response token) and reward-model score of finished sequences, one
    left-padded pass per scorer; keyed by uid."""
    if not scorers:  # grpo with a reward function and no KL: nothing scores on the trainer's side
        return {s.uid: {"ref": None, "reward": float("nan"), "critic": None} for s in seqs}
    ids, attn = left_pad([s.prompt_ids + s.response_ids for s in seqs], pad_id)
    dev = next(next(iter(scorers.values())).model.parameters()).device
    ids, attn = ids.to(dev), attn.to(dev)
    outs = {}
    for name, scorer in scorers.items():
        outs[name] = scorer.begin(ids, attn)
        scorer.release()
    res = {}
    for k, s in enumerate(seqs):
        n = len(s.response_ids)
        # no reward model: a reward function scores the finished samples after the rollout (training/trainer.py)
        reward = float(outs["reward"][k, -1]) if "reward" in outs else float("nan")
        res[s.uid] = {"ref": outs["ref"][k, ids.shape[1] - n :] if "ref" in outs else None, "reward": reward,
                      "critic": outs["critic"][k, ids.shape[1] - n :] if "critic" in outs else None}
    return res


def continuous_rollout(
    engine: ContinuousEngine,
    scorers: dict[str, IncrementalScorer],
    carried: list[Sequence],
    draw: Callable[[], list[Sequence]],
    *,
    slots: int,
    pad_id: int,
    units_needed: int,
    max_new_tokens: int,
    generator: torch.Generator,
    grouped: bool = False,
    group_size: int = 1,
    score_at_once: bool = False,
    scorer_threads: int = 1,
) -> RolloutResult:
    """Inter-step overlap on the full-batch engine (module docstring): `carried` (the deferred sequences) enter
    first, then `draw()` supplies one unit's new sequences whenever a slot is free and nothing else waits."""
    seqs: list[Sequence] = []
    pending = list(carried)
    exits: dict[int, Exit] = {}
    unit_left: dict[int, int] = {}
    completed: list[int] = []  # units in the order they finished
    worker = _FinishedScorer(scorers, pad_id, scorer_threads) if score_at_once else None
    # with score_at_once, finished units go to the scorer thread in batches of this many (by finish order)
    score_units = max(1, -(-units_needed // 4))
    ready: list[Sequence] = []
    unit_size = group_size if grouped else 1

    def unit(s: Sequence) -> int:
        return s.group if grouped else s.uid

    def source() -> Entrant | None:
        if not pending:
            pending.extend(draw())
        s = pending.pop(0)
        seqs.append(s)
        unit_left.setdefault(unit(s), unit_size)
        return Entrant(len(seqs) - 1, s.prompt_ids + s.response_ids, len(s.response_ids), done=s.finished)

    def on_exit(ex: Exit) -> bool:
        exits[ex.key] = ex
        s = seqs[ex.key]
        _apply(s, ex, engine)
        u = unit(s)
        unit_left[u] -= 1
        if unit_left[u] == 0:
            completed.append(u)
            if worker and len(completed) <= units_needed:
                ready.extend(x for x in seqs if unit(x) == u)
                if len(completed) % score_units == 0 or len(completed) == units_needed:
                    worker.put(ready)
                    ready.clear()
        return len(completed) >= units_needed

    t0 = time.perf_counter()
    in_flight, steps = engine.run(source, slots, max_new_tokens, generator, on_exit)
    for ex in in_flight:
        exits[ex.key] = ex
        _apply(seqs[ex.key], ex, engine)
    engine.release()
    t1 = time.perf_counter()

    chosen = set(completed[:units_needed])
    rows = [k for k, s in enumerate(seqs) if unit(s) in chosen]
    scores = worker.finish() if worker else (
        score_sequences(scorers, [seqs[k] for k in rows], pad_id) if rows else {})
    t2 = time.perf_counter()

    dev = engine._device()
    samples = []
    for k in rows:
        s, ex = seqs[k], exits[k]
        old = torch.tensor(ex.carried_logprobs + ex.logprobs, dtype=torch.float32, device=dev)
        sc = scores[s.uid]
        samples.append(Sample(seq=s, old_logprobs=old, ref_logprobs=(
            sc["ref"].to(old.device) if sc["ref"] is not None else None), values=(
            sc["critic"].to(old.device) if sc["critic"] is not None else None), score=sc["reward"],
            behav_logprobs=_behav(s, old)))
    chosen_rows = set(rows)
    deferred = [s for k, s in enumerate(seqs) if k not in chosen_rows] + pending
    tokens = sum(len(e.tokens) for e in exits.values())
    return RolloutResult(samples=samples, deferred=deferred, tokens_generated=tokens, decode_s=t1 - t0,
                         score_s=t2 - t1, decode_steps=steps)


def _apply(s: Sequence, ex: Exit, engine: ContinuousEngine) -> None:
    """What the engine generated for `s` joins its response (with the sampling version and log-probs)."""
    s.response_ids += ex.tokens
    s.versions += [engine.version] * len(ex.tokens)
    s.behav_logprobs += ex.logprobs
    if ex.finished and not s.finished:
        s.finished = True
        s.truncated = not s.response_ids or s.response_ids[-1] != engine.eos_id
