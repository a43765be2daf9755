"""The full-batch engine (training/rollout/continuous.py) against independent oracles.

1. Greedy: every sequence's tokens equal a plain loop's (one prompt at a time, full forward per token, no cache, no
   padding) and the chunked reference engine's (training/rollout/engine.py, all rows in one batch at a near-zero
   temperature), with prompts of different lengths, carried prefixes and a cap, so rows finish at different steps
   and slots are refilled.
2. Sampling: the behaviour log-probs of every sampled token and the re-prefilled log-probs of carried tokens equal a
   full forward's log_softmax(logits / T) at those positions.
3. Inter-step overlap on it trains exactly B samples a step, carries the unfinished ones with their tokens, and its
   log-probs of carried tokens are the proximal policy's.
"""

from __future__ import annotations

import copy

import pytest
import torch
from tiny_job import tiny_config

from training.inputs.tokenizer import make_tokenizer
from training.job.config import ModelConfig
from training.models import build_causal_lm
from training.rollout.continuous import ContinuousEngine, Entrant
from training.rollout.engine import TransformersEngine, left_pad
from training.trainer import Trainer

TINY = ModelConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(3)
    tok = make_tokenizer()
    return tok, build_causal_lm(TINY, tok, 256).eval()


def _prefixes(tok):
    """(prefix, carried count): prompts of different lengths, two with a carried partial response."""
    return [(tok.encode("ab cd? "), 0), (tok.encode("x. "), 0), (tok.encode("a much longer prompt here? ") +
            tok.encode("qz"), 2), (tok.encode("hi "), 0), (tok.encode("what is 3+4? ") + tok.encode("seven"), 5),
            (tok.encode("z"), 0), (tok.encode("mid size one. "), 0)]


@torch.no_grad()
def plain_greedy(model, prefix, n_carried, max_new, eos):
    ids = list(prefix)
    out = []
    for _ in range(max_new - n_carried):
        logits = model(torch.tensor([ids])).logits[0, -1]
        t = int(logits.argmax())
        out.append(t)
        ids.append(t)
        if t == eos:
            break
    return out


def run_engine(engine, model, items, slots, max_new, gen=None):
    engine.sync(model, 0)
    queue_ = [Entrant(k, p, c) for k, (p, c) in enumerate(items)]
    exits = {}

    def source():
        return queue_.pop(0) if queue_ else None

    def on_exit(ex):
        exits[ex.key] = ex
        return False

    left, steps = engine.run(source, slots, max_new, gen, on_exit)
    assert left == []
    return exits, steps


def _eos_with_spread(model, items, max_new):
    """A token the greedy continuations produce at different steps, so rows end at different times by eos."""
    outs = [plain_greedy(model, p, c, max_new, eos=-1) for p, c in items]
    first = {}
    for o in outs:
        for t, x in enumerate(o):
            first.setdefault(x, set()).add(t)
    return max(first, key=lambda x: (len(first[x]), -x))


@pytest.mark.parametrize(("slots", "refill_min"), [(1, 1), (3, 1), (7, 1), (4, 2)])
def test_greedy_equals_plain_loop_and_reference_engine(model, slots, refill_min):
    tok, m = model
    items = _prefixes(tok)
    max_new = 14
    eos = _eos_with_spread(m, items, max_new)
    want = [plain_greedy(m, p, c, max_new, eos) for p, c in items]
    assert len({len(w) for w in want}) >= 3  # rows really finish at different steps
    exits, steps = run_engine(ContinuousEngine(eos, tok.pad_id, greedy=True, refill_min=refill_min), m, items, slots,
                              max_new)
    got = [exits[k].tokens for k in range(len(items))]
    assert got == want
    for k, (p, c) in enumerate(items):  # and the log-probs it recorded are a full forward's, to float precision
        ex = exits[k]
        want_lp = full_logprobs(m, p + ex.tokens, len(p) - c, 1.0)
        assert torch.allclose(torch.tensor(ex.carried_logprobs + ex.logprobs), want_lp, atol=1e-5), k
    assert all(exits[k].finished for k in exits)
    if slots == 1:  # one row: every step decodes one token of one sequence
        assert steps == sum(len(w) for w in want)
    else:  # refilled rows: no step is spent with a slot idle while a sequence waits, far fewer than back to back
        assert max(len(w) for w in want) <= steps < sum(len(w) for w in want)
    # the chunked reference loop, every row in one batch, at a temperature so low that sampling is argmax
    ref = TransformersEngine(eos, tok.pad_id, temperature=1e-6)
    ref.sync(m, 0)
    ids, attn = left_pad([p for p, _ in items], tok.pad_id)
    n = len(items)
    ref.begin(ids, attn, torch.zeros(n, dtype=torch.bool), torch.tensor([c for _, c in items]), max_new,
              torch.Generator().manual_seed(0))
    chunk = ref.decode(max_new, n)
    assert [chunk.ids[i][chunk.mask[i].bool()].tolist() for i in range(n)] == want


@torch.no_grad()
def full_logprobs(model, ids, start, temperature):
    """log pi(ids[t] | ids[:t]) for t >= start from one plain forward."""
    logits = model(torch.tensor([ids])).logits[0].float() / temperature
    lp = torch.log_softmax(logits[:-1], -1).gather(-1, torch.tensor(ids[1:])[:, None]).squeeze(-1)
    return lp[start - 1 :]


@pytest.mark.parametrize(("slots", "refill_min"), [(1, 1), (4, 1), (5, 3)])
def test_sampled_logprobs_equal_a_full_forward(model, slots, refill_min):
    tok, m = model
    items = _prefixes(tok) * 2
    T = 0.7
    engine = ContinuousEngine(tok.eos_id, tok.pad_id, temperature=T, refill_min=refill_min)
    exits, _ = run_engine(engine, m, items, slots, 12,
                          torch.Generator().manual_seed(11))
    for k, (prefix, c) in enumerate(items):
        ex = exits[k]
        assert len(ex.tokens) == 12 - c or ex.tokens[-1] == tok.eos_id
        full = prefix + ex.tokens
        want = full_logprobs(m, full, len(prefix) - c, T)
        got = torch.tensor(ex.carried_logprobs + ex.logprobs)
        assert len(ex.carried_logprobs) == c
        assert torch.allclose(got, want, atol=1e-5), k
    assert len({tuple(exits[k].tokens) for k in range(7)} | {tuple(exits[k + 7].tokens) for k in range(7)}) > 7


def test_engine_runs_on_the_model_device_and_leaves_generator_state_reproducible(model):
    """The same generator seed gives the same samples (no hidden global RNG use)."""
    tok, m = model
    items = _prefixes(tok)
    a, _ = run_engine(ContinuousEngine(tok.eos_id, tok.pad_id), m, items, 3, 10, torch.Generator().manual_seed(5))
    b, _ = run_engine(ContinuousEngine(tok.eos_id, tok.pad_id), m, items, 3, 10, torch.Generator().manual_seed(5))
    assert [a[k].tokens for k in a] == [b[k].tokens for k in b]


# ------------------------------------------------------------------------------------------------------
# 3. the trainer's inter-step overlap on the continuous engine


@pytest.mark.parametrize(("overlap", "algorithm"), [("inter", "ppo"), ("full", "ppo"), ("full", "grpo")])
def test_inter_step_overlap_on_the_continuous_engine_trains_b_per_step(cache, overlap, algorithm):
    # grpo with a KL in the loss, so the reference model is built and its log-probs checked
    cfg = tiny_config(cache, seed=4, n_heldout_prompts=8, engine="continuous", eval_every=100, algorithm=algorithm,
                      ppo={"max_new_tokens": 20, "kl_coef": 0.05, "group_size": 2 if algorithm == "grpo" else 1},
                      oppo={"delta_init": 3, "adaptive_delta": False})
    tr = Trainer(cfg, overlap)
    assert isinstance(tr.engine, ContinuousEngine)
    actors, seen = {}, {}
    real_sync, real_update = tr._sync, tr._ppo_update

    critics = {}

    def sync():
        actors[tr.step] = copy.deepcopy(tr.actor).eval()
        critics[tr.step] = copy.deepcopy(tr.critic).eval() if tr.critic is not None else None
        return real_sync()

    def update(samples):
        seen[tr.step] = list(samples)
        return real_update(samples)

    tr._sync, tr._ppo_update = sync, update
    records = list(tr.run(4))
    assert [r.samples_trained for r in records] == [cfg.ppo.batch_size] * 4
    carried = 0
    for step, samples in seen.items():
        assert len({s.seq.uid for s in samples}) == cfg.ppo.batch_size
        if algorithm != "ppo":  # whole groups train, members adjacent
            groups = [s.seq.group for s in samples]
            assert all(groups.count(g) == 2 for g in groups) and groups == sorted(groups)
        for s in samples:
            resp = s.seq.response_ids
            assert s.seq.finished and len(s.old_logprobs) == len(resp) == len(s.seq.versions)
            # old log-probs: the policy at the start of this step, carried tokens re-prefilled
            want = full_logprobs(actors[step], s.seq.prompt_ids + resp, len(s.seq.prompt_ids), 1.0)
            assert torch.allclose(s.old_logprobs, want, atol=1e-5)
            for v in set(s.seq.versions):  # behaviour log-probs: the version that sampled each token
                idx = torch.tensor([t for t, x in enumerate(s.seq.versions) if x == v])
                want = full_logprobs(actors[v], s.seq.prompt_ids + resp, len(s.seq.prompt_ids), 1.0)
                assert torch.allclose(s.behav_logprobs[idx], want[idx], atol=1e-5)
            carried += sum(v < step for v in s.seq.versions)
            # what the scorers gave it: the reference's log-probs, the critic's values and the reward model's score
            ids = torch.tensor([s.seq.prompt_ids + resp])
            p = len(s.seq.prompt_ids)
            assert torch.allclose(s.ref_logprobs, full_logprobs(tr.ref, s.seq.prompt_ids + resp, p, 1.0), atol=1e-5)
            with torch.no_grad():
                assert s.score == pytest.approx(float(tr.reward_model(ids).logits[0, 0]), abs=1e-5)
                if critics[step] is not None:
                    c = critics[step]
                    values = c.score(c.base_model(ids).last_hidden_state)[0, p - 1 : p - 1 + len(resp), 0]
                    assert torch.allclose(s.values, values, atol=1e-5)
                else:
                    assert s.values is None
    assert carried > 0  # some trained response was carried over a step
    # what is carried: the unfinished ones, at most the rows in flight plus the rest of the last group drawn, each
    # below the cap; finished ones (a group's members waiting for the rest, or finishing beside the last needed)
    slots = (tr.units_per_step + 3) * tr.group_size
    assert len([s for s in tr.buffer if not s.finished]) <= slots + tr.group_size - 1
    assert all(s.finished or len(s.response_ids) < cfg.ppo.max_new_tokens for s in tr.buffer)


def test_killed_run_on_the_continuous_engine_resumes_with_identical_metrics(cache, tmp_path):
    """The carried sequences and the prompt stream survive a checkpoint: a run resumed from step 2 writes the
    uninterrupted run's metrics (timings aside)."""
    import csv

    from training.metrics import StepRecord

    cfg = tiny_config(cache, seed=4, n_heldout_prompts=8, engine="continuous", ppo={"max_new_tokens": 20})
    list(Trainer(cfg, "full", tmp_path / "a").run(4))
    gen = Trainer(cfg, "full", tmp_path / "b").run(4)
    for rec in gen:
        if rec.step == 3:
            break
    gen.close()
    resumed = Trainer(cfg, "full", tmp_path / "b")
    assert resumed.step == 2 and resumed.buffer  # something was in flight at the checkpoint
    list(resumed.run(4))
    timing = {"wall_s", "phase_rollout_s", "phase_score_s", "phase_sync_s", "phase_optim_s", "phase_eval_s"}
    assert timing <= set(StepRecord(step=0, policy_version=0, reward_mean=0.0).flat())

    def rows(path):
        with open(path) as f:
            return [{k: v for k, v in r.items() if k not in timing} for r in csv.DictReader(f)]

    a, b = rows(tmp_path / "a" / "metrics.csv"), rows(tmp_path / "b" / "metrics.csv")
    assert [r["step"] for r in b] == ["1", "2", "3", "4"]
    assert a == b, [(r["step"], k, r[k], q[k]) for r, q in zip(a, b, strict=True) for k in r if r[k] != q[k]]


def test_refill_min_batches_the_refills_without_changing_the_tokens(model):
    """Refilling only once 3 slots are free takes fewer prefill forwards (each is one forward; on a GPU each costs
    about a decode step), and greedy tokens stay the same."""
    tok, m = model
    items = _prefixes(tok) * 2
    eos = _eos_with_spread(m, items, 14)
    runs = {}
    for k in (1, 3):
        engine = ContinuousEngine(eos, tok.pad_id, greedy=True, refill_min=k)
        exits, steps = run_engine(engine, m, items, 4, 14)
        runs[k] = ([exits[i].tokens for i in range(len(items))], engine.forwards - steps, steps)
    assert runs[1][0] == runs[3][0]
    assert runs[3][1] < runs[1][1]  # fewer refill rounds
    assert runs[3][2] >= runs[1][2]  # at the price of some idle slots


def test_scoring_each_response_as_it_finishes_equals_scoring_after_decoding(cache):
    """full (a scorer thread scores every finished response the moment it finishes, in whatever batches arrive)
    and inter (the chosen ones scored in one pass after decoding) train on the same samples with the same scores on
    the continuous engine: the same records up to float rounding."""
    cfg = tiny_config(cache, seed=6, n_heldout_prompts=8, engine="continuous", eval_every=100,
                      ppo={"max_new_tokens": 20}, oppo={"delta_init": 3, "adaptive_delta": False})
    runs = {o: list(Trainer(cfg, o).run(3)) for o in ("inter", "full")}
    for a, b in zip(runs["inter"], runs["full"], strict=True):
        assert a.tokens_generated == b.tokens_generated and a.response_len_mean == b.response_len_mean
        for f in ("reward_mean", "reward_std", "kl", "loss_policy", "loss_value", "adv_std", "ret_mean"):
            assert getattr(a, f) == pytest.approx(getattr(b, f), rel=1e-4, abs=1e-5), f
    assert runs["full"][0].phase_seconds["score"] >= 0
