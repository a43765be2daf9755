"""OPPO's controls step by step, not only at their limits.

- The Delta controller against a transcription of the paper's Algorithm 1 (lines 21-27; the OPPO paper,
  /work/shared/seeds/002_240beef6346ce9f5.txt), and against traces written out by hand, over several windows.
- Which B samples a rollout trains on: the first B units to finish (ties by row order; a group when its last member
  finishes; a unit finished in an earlier step first), on a scripted engine whose finishing columns are known.
- `oppo.max_staleness` 0 and 1 on a real tiny OPPO run: the tokens trained equal a hand count over the per-token
  policy versions of the samples the trainer was given; and the trainer's Delta per step equals Algorithm 1 fed with
  the step rewards it recorded, with B + Delta prompts in flight.
"""

from __future__ import annotations

import json
import math
from collections import Counter

import pytest
import torch

from training.rollout.controllers import ChunkTuner, DeltaController, deferral_histogram
from training.rollout.engine import Chunk, _units_done
from training.rollout.streaming import Sequence, rollout


# ------------------------------------------------------------------------------------------------ Delta (Alg. 1)
def algorithm1(rewards, delta, lo, hi, w, rule="eq4") -> list[int]:
    """Algorithm 1 lines 18 and 21-27, transcribed: after each step's reward, the Delta the next step uses. `rule`
    "alg1" is line 24 as printed (Delta - sign(d) * change, sign(0) = 0); "eq4" moves it the way Eq. 4 does (up when
    the reward improved, d > 0, down otherwise)."""
    scores, out = [], []
    for r in rewards:
        scores.append(r)  # line 18
        if len(scores) >= 2 * w:  # line 21
            d = sum(scores[-w:]) / w - sum(scores[-2 * w:-w]) / w  # line 22
            change = max(1, math.floor(delta / 4))  # line 23
            sign = (d > 0) - (d < 0)
            step = -sign if rule == "alg1" else (1 if d > 0 else -1)
            delta = min(hi, max(lo, delta + step * change))  # line 24 (clip)
            scores = scores[-w:]  # line 26
        out.append(delta)
    return out


REWARDS = [1, 1, 2, 2, 3, 3, 3, 3, 2, 2, 1, 1, 5, 5]
# By hand, Delta_init 8 in [0, 12], W = 2: an update every 2 steps once 4 rewards are in (t = 4, 6, 8, 10, 12, 14):
#   eq4:  d = +1: 8 + max(1, 8//4 = 2) = 10;  d = +1: 10 + 2 = 12 (cap);  d = 0: 12 - 3 = 9;  d = -1: 9 - 2 = 7;
#         d = -1: 7 - 1 = 6;  d = +4: 6 + 1 = 7
#   alg1: d = +1: 8 - 2 = 6;  d = +1: 6 - 1 = 5;  d = 0: unchanged 5;  d = -1: 5 + 1 = 6;  d = -1: 6 + 1 = 7;
#         d = +4: 7 - 1 = 6
HAND = {"eq4": [8, 8, 8, 10, 10, 12, 12, 9, 9, 7, 7, 6, 6, 7],
        "alg1": [8, 8, 8, 6, 6, 5, 5, 5, 5, 6, 6, 7, 7, 6]}


@pytest.mark.parametrize("rule", ["eq4", "alg1"])
def test_delta_trace_by_hand_over_several_windows(rule):
    c = DeltaController(delta_init=8, delta_min=0, delta_max=12, window=2, rule=rule)
    assert [c.update(r) for r in REWARDS] == HAND[rule]
    assert algorithm1(REWARDS, 8, 0, 12, 2, rule) == HAND[rule]  # the transcription agrees with the hand trace


def test_delta_floor_by_hand():
    # Delta 6 in [5, 8], W = 1: d = -1: 6 - 1 = 5;  d = -1: 5 - 1 -> 5 (floor);  d = 0 (eq4: down): 5
    c = DeltaController(delta_init=6, delta_min=5, delta_max=8, window=1)
    assert [c.update(r) for r in [3, 2, 1, 1]] == [6, 5, 5, 5]


@pytest.mark.parametrize("rule", ["eq4", "alg1"])
@pytest.mark.parametrize("seed", range(6))
def test_delta_trace_equals_algorithm_1_on_random_rewards(rule, seed):
    g = torch.Generator().manual_seed(seed)
    w = 1 + seed % 4
    rewards = (torch.randn(60, generator=g).cumsum(0) * 0.3).round(decimals=1).tolist()  # ties (d = 0) happen
    init, lo, hi = 4 + seed, seed % 3, 12 + 3 * seed
    c = DeltaController(delta_init=init, delta_min=lo, delta_max=hi, window=w, rule=rule)
    assert [c.update(r) for r in rewards] == algorithm1(rewards, init, lo, hi, w, rule)


def test_delta_windows_are_the_last_w_and_the_w_before_on_a_longer_history():
    """Line 22 reads the last W rewards and the W before them, however many are kept: a controller resumed from the
    state of one with a longer window (5 kept rewards, W = 2 now) compares [5, 5] with [1, 1], not the older ones.
    By hand: rewards -10, -10, 5, 5, 1 then 1: d = mean(1, 1) - mean(5, 5) = -4: Delta 8 - max(1, 8 // 4) = 6."""
    c = DeltaController(delta_init=8, delta_min=0, delta_max=12, window=2)
    c.load_state_dict({"delta": 8, "rewards": [-10.0, -10.0, 5.0, 5.0, 1.0]})
    assert c.update(1.0) == 6
    assert c.state_dict() == {"delta": 6, "rewards": [1.0, 1.0]}  # line 26: the last W kept


def test_a_nan_reward_is_not_a_step_of_the_window():
    c = DeltaController(delta_init=8, delta_min=0, delta_max=12, window=2)
    with_nan = [1, math.nan, 1, 2, math.nan, 2]  # the same four rewards as [1, 1, 2, 2]: one update, to 10
    assert [c.update(r) for r in with_nan] == [8, 8, 8, 8, 8, 10]


# ------------------------------------------------------------------------------ chunk size C and deferrals
def test_chunk_tuner_keeps_the_fastest_per_token_candidate_by_hand():
    """Candidates 8, 16, 32 tried one step each from step 0 (every 4 steps). Per generated token: 8: 2.0 s / 100 =
    0.02; 16: 3.0 s / 300 = 0.01; 32: 0.015 s / 0 tokens (counted as 1) = 0.015. Kept: 16, although 32 took the
    fewest seconds and 8 the fewest seconds x tokens."""
    t = ChunkTuner(initial=16, candidates=[8, 16, 32], every=4)
    assert t.chunk_for_step(0) == 8
    t.report(16, 0.001, 100)  # not the candidate on trial: ignored
    t.report(8, 2.0, 100)
    assert t.state_dict() == {"current": 16, "trial": [16, 32], "measured": {8: 0.02}}
    # resumed mid-round from JSON (string keys): the round goes on where it stopped
    t2 = ChunkTuner(initial=64, candidates=[64], every=99)
    t2.load_state_dict(json.loads(json.dumps(t.state_dict())))
    assert t2.state_dict() == t.state_dict()
    for tuner in (t, t2):
        assert tuner.chunk_for_step(1) == 16
        tuner.report(16, 3.0, 300)
        assert tuner.chunk_for_step(2) == 32
        tuner.report(32, 0.015, 0)
        assert tuner.state_dict()["current"] == 16 and tuner.state_dict()["trial"] == []
        assert tuner.state_dict()["measured"] == {}  # a finished round keeps no measurements
        tuner.report(8, 0.0001, 100)  # no round on: ignored
        assert [tuner.chunk_for_step(s) for s in (3, 5, 6, 7)] == [16, 16, 16, 16]
    assert t.chunk_for_step(8) == 8  # step 8 = 2 x 4: the next round starts (t2 tunes every 99 steps)
    assert t2.chunk_for_step(8) == 16 and t2.chunk_for_step(99) == 64  # t2's own candidates


def test_a_disabled_chunk_tuner_never_leaves_its_initial_size():
    t = ChunkTuner(initial=16, candidates=[8, 32], every=1, enabled=False)
    t.report(8, 0.001, 100)
    assert [t.chunk_for_step(s) for s in range(4)] == [16] * 4
    assert t.state_dict() == {"current": 16, "trial": [], "measured": {}}


def test_deferral_histogram_by_hand():
    # 8 trained requests deferred 0, 0, 1, 2, 3, 3, 3, 5 steps: shares 2/8, 1/8, 1/8, 4/8 (3 or more); mean 17/8
    counts = Counter({0: 2, 1: 1, 2: 1, 3: 3, 5: 1})
    assert deferral_histogram(counts) == {"0": 0.25, "1": 0.125, "2": 0.125, "3+": 0.5, "mean": 2.125, "n": 8.0}
    assert deferral_histogram(counts, max_bucket=2) == {"0": 0.25, "1": 0.125, "2+": 0.625, "mean": 2.125, "n": 8.0}
    assert deferral_histogram(Counter()) == {"0": 0.0, "1": 0.0, "2": 0.0, "3+": 0.0, "mean": 0.0, "n": 0.0}


# ------------------------------------------------------------------------------ which B samples are trained
EOS, PAD, TOKEN = 1, 0, 5


class ScriptedEngine:
    """A generation engine whose rows finish at known lengths: sequence `uid` ends (EOS) when its response reaches
    `length[uid]` tokens, or is truncated at `max_new_tokens`. Emits TOKEN otherwise."""

    def __init__(self, seqs: list[Sequence], length: dict[int, int], version: int):
        self.length = [length[s.uid] for s in seqs]
        self.version, self.eos_id = version, EOS

    def begin(self, ids, attn, done, n_resp, max_new_tokens, generator):
        self.done, self.n_resp, self.max_new = done.clone(), n_resp.clone(), max_new_tokens
        return torch.zeros(ids.shape)

    def decode(self, max_tokens, stop_when_done, groups=None) -> Chunk:
        n = self.done.shape[0]
        finish_col = torch.full((n,), -1, dtype=torch.long)
        toks, masks = [], []
        for c in range(max_tokens):
            if _units_done(self.done, groups) >= stop_when_done or bool(self.done.all()):
                break
            active = ~self.done
            self.n_resp = self.n_resp + active.long()
            ends = torch.tensor([int(self.n_resp[i]) >= self.length[i] for i in range(n)])
            newly = active & (ends | (self.n_resp >= self.max_new))
            toks.append(torch.where(active, torch.where(ends, EOS, TOKEN), PAD))
            masks.append(active.long())
            finish_col[newly] = c
            self.done = self.done | newly
        if not toks:
            empty = torch.zeros(n, 0, dtype=torch.long)
            return Chunk(empty, empty, torch.zeros(n, 0), finish_col)
        ids = torch.stack(toks, 1)
        return Chunk(ids, torch.stack(masks, 1), torch.zeros(ids.shape), finish_col)

    def release(self):
        pass


class ZeroScorer:
    def begin(self, ids, attn):
        return torch.zeros(ids.shape)

    def release(self):
        pass


def seqs_of(uids, group_size=1, step=0) -> list[Sequence]:
    return [Sequence(uid=u, group=u // group_size, prompt="p", prompt_ids=[7, 8, 9], enqueued_step=step)
            for u in uids]


def run(seqs, length, units, version=0, grouped=False, max_new=10, chunk=3):
    engine = ScriptedEngine(seqs, length, version)
    scorers = {"ref": ZeroScorer(), "reward": ZeroScorer()}
    return rollout(engine, scorers, seqs, pad_id=PAD, units_needed=units, max_new_tokens=max_new, chunk_size=chunk,
                   stream=False, generator=torch.Generator(), grouped=grouped)


def test_the_first_b_sequences_to_finish_are_trained_the_rest_carried():
    # lengths 5, 2, 7, 2, 4, 9 finish at decode columns 4, 1, 6, 1, 3, 8; B = 3: uids 1, 3 (column 1) and 4 (column
    # 3). Decoding stops after column 3 (4 columns), so the carried uids 0, 2, 5 hold 4 tokens each.
    seqs = seqs_of(range(6))
    out = run(seqs, {0: 5, 1: 2, 2: 7, 3: 2, 4: 4, 5: 9}, units=3, version=2)
    assert [s.seq.uid for s in out.samples] == [1, 3, 4]
    assert [s.uid for s in out.deferred] == [0, 2, 5]
    assert [len(s.response_ids) for s in out.deferred] == [4, 4, 4]
    assert all(not s.finished for s in out.deferred)
    assert out.tokens_generated == 2 + 2 + 4 + 3 * 4 and out.decode_steps == 4
    assert [s.seq.response_ids[-1] for s in out.samples] == [EOS] * 3
    assert [s.seq.versions for s in out.samples] == [[2, 2], [2, 2], [2, 2, 2, 2]]


def test_a_tie_at_the_cut_goes_to_the_earlier_row_and_a_carried_finished_one_trains_first():
    # uids 1 and 2 both finish at column 1; B = 1: uid 1 trains, uid 2 is carried finished
    seqs = seqs_of(range(3))
    first = run(seqs, {0: 3, 1: 2, 2: 2}, units=1, version=4)
    assert [s.seq.uid for s in first.samples] == [1]
    carried = {s.uid: s for s in first.deferred}
    assert set(carried) == {0, 2} and carried[2].finished and not carried[0].finished
    # next step (version 5): the carried finished uid 2 is done before any decoding, so it is the one trained,
    # ahead of uid 0 (one token short) and a fresh uid 3 (one token long); nothing is decoded
    second = run(first.deferred + seqs_of([3], step=1), {0: 3, 2: 2, 3: 1}, units=1, version=5)
    assert [s.seq.uid for s in second.samples] == [2] and second.decode_steps == 0
    assert second.samples[0].seq.versions == [4, 4]
    assert [s.uid for s in second.deferred] == [0, 3] and len(second.deferred[0].response_ids) == 2


def test_a_group_finishes_with_its_last_member():
    # groups of two: group 0 = uids 0, 1 (lengths 2 and 6: done at column 5), group 1 = uids 2, 3 (4 and 4: column 3)
    seqs = seqs_of(range(4), group_size=2)
    out = run(seqs, {0: 2, 1: 6, 2: 4, 3: 4}, units=1, grouped=True)
    assert [s.seq.uid for s in out.samples] == [2, 3]
    assert [s.uid for s in out.deferred] == [0, 1]


# ------------------------------------------------------------- a real tiny OPPO run: staleness bound and Delta
def tiny(cache_dir, **oppo):
    from training.job.config import TrainConfig

    return TrainConfig.model_validate({
        "seed": 5, "steps": 6, "cache_dir": str(cache_dir),
        "policy": {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "intermediate_size": 64},
        "reward": {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "intermediate_size": 64},
        "task": {"n_train_prompts": 24, "n_heldout_prompts": 8, "n_pairs": 32, "rm_epochs": 1, "sft_steps": 8,
                 "long_mean_len": 10.0},
        "ppo": {"batch_size": 4, "max_new_tokens": 16, "num_ppo_epochs": 1, "num_mini_batches": 1},
        "oppo": {"tune_chunk": False, "delta_init": 8, "delta_min": 0, "delta_max": 8, "delta_window": 1, **oppo},
        "checkpoint_every": 100, "eval_every": 100, "eval_prompts": 8,
    })


def spied_run(cfg):
    """Train `cfg` with inter-step overlap; returns the records and, per step, the per-token policy versions of the
    samples handed to the PPO update and the version being trained (the trainer's step before it increments)."""
    from training.trainer import Trainer

    trainer = Trainer(cfg, "inter")
    given = []
    update = trainer._ppo_update

    def spy(samples):
        given.append((trainer.step, [list(s.seq.versions) for s in samples]))
        return update(samples)

    trainer._ppo_update = spy
    records = list(trainer.run(cfg.steps))
    return records, given


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("oppo-cache")


@pytest.mark.parametrize("bound", [None, 0, 1])
def test_max_staleness_trains_exactly_the_tokens_within_the_bound(cache, bound):
    records, given = spied_run(tiny(cache, max_staleness=bound, adaptive_delta=False))
    lags = []
    for rec, (version, versions) in zip(records, given, strict=True):
        step_lags = [version - v for vs in versions for v in vs]
        lags += step_lags
        # the hand count: every token of a trained sample whose generating policy is at most `bound` versions old
        want = sum(1 for lag in step_lags if bound is None or lag <= bound)
        assert rec.tokens_trained == want, (rec.step, bound)
        assert rec.samples_trained == 4  # B
        if want:
            assert rec.staleness_max == max(lag for lag in step_lags if bound is None or lag <= bound)
    # the run must have carried tokens for the bound to matter: some are 1 step old, some 2 or more
    assert max(lags) >= 2 and 1 in lags, lags


def test_the_trainers_delta_follows_algorithm_1_with_b_plus_delta_in_flight(cache):
    records, _ = spied_run(tiny(cache, delta_init=4, delta_min=0, delta_max=8, delta_window=1))
    rewards = [r.reward_mean for r in records]
    expected = [4] + algorithm1(rewards, 4, 0, 8, 1, "eq4")[:-1]  # the Delta each step ran with
    assert [r.delta for r in records] == expected
    # B + Delta prompts in flight (more when more were carried than that), B trained, the rest carried
    carried = 0
    for r in records:
        in_flight = max(4 + r.delta, carried)
        assert r.deferred == in_flight - 4, r.step
        carried = r.deferred
