"""Three behaviours of the critic-free (grpo/rloo) training code, pinned against hand-computed oracles before
`training/` is restructured.

1. A GRPO update with the KL in the loss (`ppo.kl_in: loss`, `ppo.kl_coef` > 0), with no off-policy correction and
   with each correction of `training/algorithms/core_algos.py` CORRECTIONS ("tis", "decoupled"): the real update path
   (`PPOUpdate._ppo_update` of a tiny trainer) gets samples whose old, behaviour and reference log-probs the test
   chooses; the advantages it trains with are the group advantages of the scores alone (the KL does not enter the
   rewards when it is paid in the loss), the reported `kl_loss` is the masked mean of k3 = exp(d) - d - 1
   (d = ref logp - logp) over the real tokens, and the loss is the (importance-weighted) clipped surrogate plus
   kl_coef times that k3, unweighted. Every oracle is written out below in float64 numpy from the policy's own
   log-probs (one plain forward per sequence, no padding), never through the code under test's helpers.
2. The continuous engine (`engine: continuous`, inter-step overlap) trains the first groups to finish: the test
   watches the engine's finish events (the order in which it reports sequences finished) and checks, step by step,
   that no group whose members had all finished is carried while a group that finished later is trained, and that
   the trained groups are exactly the first B/G groups to finish. The seed is one where a group that completed in
   the same decode step as the last trained one (but after it) is carried, and where a group drawn later trains
   before one drawn earlier, so neither half holds vacuously.
3. `group_stats` (flat share, mean within-group spread) on batches whose group count differs from the group size
   (3 groups of 4, 5 groups of 2, 2 groups of 3 with an unscored member), against values worked by hand: a
   reshape with the two swapped gives other numbers.
"""

from __future__ import annotations

import inspect
import math

import numpy as np
import pytest
import torch
from tiny_job import tiny_config

from training.algorithms import core_algos as P
from training.rollout.continuous import ContinuousEngine
from training.rollout.streaming import Sample, Sequence
from training.trainer import Trainer

BETA = 0.1      # kl_coef, paid in the loss
CLIP = 0.2      # cliprange (the grpo default)
CAP = 2.0       # oppo.is_cap
G = 3           # group size of the update test: 2 groups of 3
#: one response length per sample, all different (a captured loss-call row is matched to its sample by its length)
LENGTHS = [5, 3, 8, 4, 7, 6]
SCORES = [1.0, 0.2, -0.5, 0.3, 0.3, 1.1]


@pytest.fixture(autouse=True, scope="module")
def _torch_threads():
    """The trainers here run torch on one thread (`oppo.torch_threads`); the process's setting is put back."""
    was = torch.get_num_threads()
    yield
    torch.set_num_threads(was)


# ------------------------------------------------------------------------------------------------------
# 1. grpo, KL in the loss, with and without the off-policy correction


def hand_group_advantages(scores: list[float], group_size: int) -> np.ndarray:
    """GRPO's advantage worked by hand: (r - group mean) / (unbiased group std + 1e-4), group by group."""
    out = []
    for k in range(0, len(scores), group_size):
        r = [float(x) for x in scores[k : k + group_size]]
        mean = sum(r) / len(r)
        std = math.sqrt(sum((x - mean) ** 2 for x in r) / (len(r) - 1))
        out += [(x - mean) / (std + 1e-4) for x in r]
    return np.array(out)


@torch.no_grad()
def plain_logprobs(model, prompt_ids: list[int], response_ids: list[int]) -> np.ndarray:
    """log pi(response token t | prompt, tokens before t) from one unpadded forward (temperature 1)."""
    ids = torch.tensor([prompt_ids + response_ids])
    logits = model(ids).logits[0].double()
    p = len(prompt_ids)
    logp = torch.log_softmax(logits[p - 1 : p - 1 + len(response_ids)], -1)
    return logp[torch.arange(len(response_ids)), torch.tensor(response_ids)].numpy()


def kl_in_loss_trainer(cache, correction: str) -> Trainer:
    cfg = tiny_config(cache, seed=11, n_heldout_prompts=8, algorithm="grpo", eval_every=100,
                      ppo={"group_size": G, "batch_size": len(LENGTHS), "kl_coef": BETA, "kl_in": "loss",
                           "num_ppo_epochs": 1, "num_mini_batches": 1, "whiten_advantages": False,
                           "scale_rewards": "group", "cliprange": CLIP, "ent_coef": 0.0, "temperature": 1.0},
                      oppo={"correction": correction, "is_cap": CAP, "torch_threads": 1})
    tr = Trainer(cfg, "none")
    assert tr.grouped and tr.group_size == G and tr.ref is not None and tr.critic is None
    # the engine holds the actor: the update takes the samples' old log-probs as the proximal policy's
    tr._sync()
    return tr


def hand_samples(tr: Trainer) -> tuple[list[Sample], dict[str, np.ndarray]]:
    """Two groups of three finished samples with log-probs chosen around the actor's own: old = the actor's + noise
    (ratios off 1, some clipped), behaviour = old + wider noise (importance weights on both sides of the cap),
    reference = the actor's + noise (a k3 KL well above 0, a k1 sum that differs from member to member)."""
    rng = np.random.default_rng(7)
    prompts = ["what is 3+4? ", "ab cd? "]
    text = tr.tok.encode("the answer is 7 because three and four")
    samples, lp, old, behav, ref = [], [], [], [], []
    for i, L in enumerate(LENGTHS):
        prompt_ids = tr.tok.encode(prompts[i // G])
        response = text[i : i + L]
        actor_lp = plain_logprobs(tr.actor, prompt_ids, response)
        o = actor_lp + rng.normal(0.0, 0.3, L)
        b = o + rng.normal(0.0, 0.6, L)
        r = actor_lp + rng.normal(0.0, 0.5, L)
        seq = Sequence(uid=i, group=(i // G) * G, prompt=prompts[i // G], prompt_ids=prompt_ids, enqueued_step=0,
                       response_ids=list(response), versions=[0] * L, behav_logprobs=b.tolist(), finished=True)
        samples.append(Sample(seq=seq, old_logprobs=torch.tensor(o, dtype=torch.float32),
                              ref_logprobs=torch.tensor(r, dtype=torch.float32), values=None, score=SCORES[i],
                              behav_logprobs=torch.tensor(b, dtype=torch.float32)))
        # the oracle reads the float32 values the update reads
        lp.append(actor_lp)
        old.append(o.astype(np.float32).astype(np.float64))
        behav.append(b.astype(np.float32).astype(np.float64))
        ref.append(r.astype(np.float32).astype(np.float64))
    return samples, {"lp": lp, "old": old, "behav": behav, "ref": ref}


def hand_loss(x: dict[str, list[np.ndarray]], adv: np.ndarray, correction: str) -> tuple[float, float]:
    """(the loss, the mean k3) by hand over every real token of the batch (one mini-batch, token-level mean)."""
    per_token, k3s = [], []
    for i in range(len(LENGTHS)):
        lp, old, behav, ref = x["lp"][i], x["old"][i], x["behav"][i], x["ref"][i]
        ratio = np.exp(lp - old)
        surrogate = np.maximum(-adv[i] * ratio, -adv[i] * np.clip(ratio, 1 - CLIP, 1 + CLIP))
        w = np.exp(old - behav)  # pi_prox / pi_behav; pi_prox is the old log-probs (the engine is the actor)
        if correction == "tis":
            w = np.minimum(w, CAP)
        elif correction == "decoupled":
            w = np.where(w <= CAP, w, 0.0)
        else:
            w = np.ones_like(w)
        d = ref - lp
        k3 = np.exp(d) - d - 1
        per_token.append(w * surrogate + BETA * k3)
        k3s.append(k3)
    return float(np.concatenate(per_token).mean()), float(np.concatenate(k3s).mean())


@pytest.mark.parametrize("correction", ["none", "tis", "decoupled"])
def test_grpo_kl_in_the_loss_leaves_the_advantages_to_the_scores_and_adds_beta_times_k3(cache, monkeypatch,
                                                                                       correction):
    """kl_in loss: the advantages are the group advantages of the scores alone, `kl_loss` is the mean k3 over the real
    tokens, and the loss is the (weighted) clipped surrogate + kl_coef * k3 (unweighted), with no correction and with
    each correction; all against float64 formulas written here."""
    assert set(P.CORRECTIONS) == {"none", "tis", "decoupled"}
    tr = kl_in_loss_trainer(cache, correction)
    samples, x = hand_samples(tr)
    adv = hand_group_advantages(SCORES, G)
    # the inputs really exercise what is pinned: clipped ratios, weights above the cap, member-to-member k1 sums
    ratios = np.concatenate([np.exp(a - b) for a, b in zip(x["lp"], x["old"], strict=True)])
    assert (np.abs(ratios - 1) > CLIP).any() and (np.abs(ratios - 1) < CLIP).any()
    assert (np.concatenate([np.exp(a - b) for a, b in zip(x["old"], x["behav"], strict=True)]) > CAP).any()
    k1 = [float(np.sum(a - b)) for a, b in zip(x["old"], x["ref"], strict=True)]
    assert np.ptp(k1) > 0.5

    # a spy on the loss call: which surrogate the update calls, and the advantages and KL coefficient it passes
    calls = []
    for name in ("policy_loss", "corrected_policy_loss"):
        real = getattr(P, name)

        def spy(*args, _real=real, _name=name, **kwargs):
            bound = inspect.signature(_real).bind(*args, **kwargs)
            bound.apply_defaults()
            a = bound.arguments
            calls.append((_name, a["advantages"].detach().cpu().clone(), a["mask"].detach().cpu().clone(),
                          a["kl_coef"]))
            return _real(*args, **kwargs)

        monkeypatch.setattr(P, name, spy)

    out = tr._ppo_update(samples)

    want_call = "policy_loss" if correction == "none" else "corrected_policy_loss"
    assert calls and {c[0] for c in calls} == {want_call}
    assert {c[3] for c in calls} == {BETA}, "the loss must add the KL with kl_coef"
    seen = set()
    for _, adv_rows, mask, _ in calls:
        for row, m in zip(adv_rows, mask, strict=True):
            L = int(m.sum())
            i = LENGTHS.index(L)
            seen.add(i)
            got = row[m.bool()].double().numpy()
            assert np.allclose(got, adv[i], rtol=1e-5, atol=1e-5), (i, got, adv[i])
    assert seen == set(range(len(LENGTHS)))

    # the reported statistics of the advantages: over every real token (each sample's advantage L times)
    tokens_adv = np.concatenate([np.full(L, a) for L, a in zip(LENGTHS, adv, strict=True)])
    assert out["adv_mean"] == pytest.approx(tokens_adv.mean(), abs=1e-5)
    assert out["adv_std"] == pytest.approx(tokens_adv.std(ddof=1), rel=1e-5)

    want_loss, want_k3 = hand_loss(x, adv, correction)
    assert out["kl_loss"] == pytest.approx(want_k3, rel=1e-4, abs=1e-6)
    assert out["loss_policy"] == pytest.approx(want_loss, rel=1e-4, abs=1e-5)
    # the k1 KL is still reported (summed over each response, averaged over the batch), though it is not paid there
    assert out["kl"] == pytest.approx(float(np.mean(k1)), rel=1e-4, abs=1e-6)
    assert out["tokens_trained"] == sum(LENGTHS)


# ------------------------------------------------------------------------------------------------------
# 2. the continuous engine trains the first groups to finish


class FinishOrder:
    """Watches a trainer on the continuous engine. For every step (1-based): each group's completion time (the index
    of the engine's finish report at which its last member finished; -1 for a group whose members had all finished
    before the step, carried in complete), the groups trained, and the groups carried with every member finished.
    The finish events come from the engine's `on_exit` calls (the order the engine reports sequences finishing),
    the sequences from the trainer's buffer and the units it draws."""

    def __init__(self, tr: Trainer):
        self.completion: dict[int, dict[int, int]] = {}
        self.trained: dict[int, list[int]] = {}
        self.carried_complete: dict[int, list[int]] = {}
        self.carried_incomplete: dict[int, list[int]] = {}
        self.drawn: list[int] = []
        drawn_now: list[Sequence] = []
        real_new, real_run, real_update = tr._new_unit, tr.engine.run, tr._ppo_update

        def new_unit():
            unit = real_new()
            drawn_now.extend(unit)
            self.drawn.append(unit[0].group)
            return unit

        def run(source, slots, max_new_tokens, generator, on_exit):
            step = tr.step + 1
            carried = list(tr.buffer)
            drawn_now.clear()
            finished_at: dict[int, int] = {s.uid: -1 for s in carried if s.finished}
            members: dict[int, set[int]] = {}
            events = [0]

            def spy(ex):
                stop = on_exit(ex)
                for s in carried + drawn_now:
                    members.setdefault(s.group, set()).add(s.uid)
                    if s.finished and s.uid not in finished_at:
                        finished_at[s.uid] = events[0]
                events[0] += 1
                return stop

            left = real_run(source, slots, max_new_tokens, generator, spy)
            for s in carried + drawn_now:
                members.setdefault(s.group, set()).add(s.uid)
            self.completion[step] = {g: max(finished_at[u] for u in us) for g, us in members.items()
                                     if all(u in finished_at for u in us)}
            return left

        def update(samples):
            step = tr.step + 1
            self.trained[step] = sorted({s.seq.group for s in samples})
            groups: dict[int, list[bool]] = {}
            for s in tr.buffer:
                groups.setdefault(s.group, []).append(s.finished)
            self.carried_complete[step] = sorted(g for g, f in groups.items() if all(f))
            self.carried_incomplete[step] = sorted(g for g, f in groups.items() if not all(f))
            return real_update(samples)

        tr._new_unit, tr.engine.run, tr._ppo_update = new_unit, run, update


def test_continuous_engine_trains_the_first_groups_to_finish_and_carries_the_later_ones(cache):
    """Whole groups of 2, 2 trained a step out of 2 + 2 in flight: at every step the trained groups are the first
    B/G to complete (by the engine's finish reports), and a group complete before a trained one is never carried."""
    cfg = tiny_config(cache, seed=5, n_heldout_prompts=8, algorithm="grpo", engine="continuous", eval_every=100,
                      task={"sft_steps": 150}, ppo={"group_size": 2, "batch_size": 4, "max_new_tokens": 16},
                      oppo={"delta_init": 2, "adaptive_delta": False, "torch_threads": 1})
    tr = Trainer(cfg, "inter")
    assert isinstance(tr.engine, ContinuousEngine)
    watch = FinishOrder(tr)
    steps = 4
    records = list(tr.run(steps))
    assert [r.samples_trained for r in records] == [cfg.ppo.batch_size] * steps
    per_step = cfg.ppo.batch_size // cfg.ppo.group_size

    ties = later_drawn_first = 0
    for step in range(1, steps + 1):
        done = watch.completion[step]
        trained, complete = watch.trained[step], watch.carried_complete[step]
        assert len(trained) == per_step
        assert all(g in done for g in trained), f"step {step}: a trained group had not finished: {trained} {done}"
        assert all(g in done for g in complete)
        assert not any(g in done for g in watch.carried_incomplete[step])
        for t in trained:
            for c in complete:
                assert done[t] < done[c] or done[t] == done[c] == -1, (
                    f"step {step}: group {c} (complete at {done[c]}) carried while group {t} (complete at "
                    f"{done[t]}) trained")
        # the trained groups are the first ones to complete (a group completes at one finish report; only groups
        # complete before the step can tie, at -1)
        first = sorted(done, key=lambda g: done[g])[:per_step]
        if len({done[g] for g in first}) == per_step:
            assert trained == sorted(first), f"step {step}: trained {trained}, first to finish {first}: {done}"
        ties += sum(1 for c in complete if done[c] >= 0)
        later_drawn_first += any(c < t for c in watch.carried_incomplete[step] + complete for t in trained)
    # not vacuous: a group complete at the stop (finishing in the same decode step as, after, the last trained one)
    # was carried, and a group drawn later trained while an earlier one was carried
    assert ties > 0, "no complete group was ever carried: pick a seed where one is, or the test proves little"
    assert later_drawn_first > 0


# ------------------------------------------------------------------------------------------------------
# 3. group statistics when the group count is not the group size


@pytest.mark.parametrize(("rewards", "group_size", "flat", "spread"), [
    # 3 groups of 4: [1,1,1,1] flat (std 0); [0,1,2,3] std sqrt(5/3); [2,2,4,4] std sqrt(4/3)
    ([1, 1, 1, 1, 0, 1, 2, 3, 2, 2, 4, 4], 4, 1 / 3, (math.sqrt(5 / 3) + math.sqrt(4 / 3)) / 3),
    # 5 groups of 2: [0,2] std sqrt(2); [5,5] flat; [1,4] std 3/sqrt(2); [3,3] flat; [-1,0] std 1/sqrt(2)
    ([0, 2, 5, 5, 1, 4, 3, 3, -1, 0], 2, 2 / 5, (math.sqrt(2) + 3 / math.sqrt(2) + 1 / math.sqrt(2)) / 5),
    # 2 groups of 3, one member unscored: [1, nan, 3] -> [1,3] std sqrt(2); [2,2,2] flat
    ([1, float("nan"), 3, 2, 2, 2], 3, 1 / 2, math.sqrt(2) / 2),
    # 3 groups of 2 with one unscored member: the group [nan, 4] has no two scored members and is left out
    ([float("nan"), 4, 1, 1, 0, 6], 2, 1 / 2, math.sqrt(18) / 2),
])
def test_group_stats_reads_consecutive_groups_of_group_size(rewards, group_size, flat, spread):
    """`group_stats` reads the batch as consecutive groups of `group_size` (not `group_size` groups): flat share and
    mean unbiased within-group std over the groups with two scored members, against values worked by hand."""
    got_flat, got_spread = P.group_stats(torch.tensor(rewards, dtype=torch.float32), group_size)
    assert got_flat == pytest.approx(flat, abs=1e-12)
    assert got_spread == pytest.approx(spread, rel=1e-6)


def test_group_stats_is_nan_when_no_group_has_two_scored_members():
    nan = float("nan")
    got = P.group_stats(torch.tensor([nan, 1.0, 2.0, nan, nan, nan]), 2)
    assert all(math.isnan(v) for v in got)
