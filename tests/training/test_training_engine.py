"""Engine and streaming scorers: streamed (chunked, KV-cached) outputs equal one full-sequence pass."""

import pytest
import torch

from training.inputs.tokenizer import make_tokenizer
from training.job.config import ModelConfig
from training.models import build_causal_lm, build_scorer
from training.rollout.engine import IncrementalScorer, TransformersEngine, left_pad
from training.rollout.streaming import Sequence, rollout

TINY = ModelConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64)


@pytest.fixture(scope="module")
def models():
    torch.manual_seed(0)
    tok = make_tokenizer()
    actor = build_causal_lm(TINY, tok, 128).eval()
    ref = build_causal_lm(TINY, tok, 128).eval()
    critic = build_scorer(TINY, tok, 128).eval()
    rm = build_scorer(TINY, tok, 128).eval()
    return tok, actor, ref, critic, rm


def _batch(tok):
    """Left-padded prefixes (one carries a partial response) and ragged continuations."""
    prefixes = [tok.encode("ab cd? "), tok.encode("x. "), tok.encode("long one here? ") + tok.encode("abc")]
    conts = [tok.encode("hello world"), tok.encode("hi"), tok.encode("a bb ccc dddd")]
    return prefixes, conts


@pytest.mark.parametrize("kind", ["logprob", "value", "reward"])
@pytest.mark.parametrize("chunk", [1, 3, 8])
def test_streamed_equals_full_sequence(models, kind, chunk):
    tok, _, ref, critic, rm = models
    model = {"logprob": ref, "value": critic, "reward": rm}[kind]
    prefixes, conts = _batch(tok)
    ids, attn = left_pad(prefixes, tok.pad_id)
    width = max(len(c) for c in conts)
    cont_ids = torch.full((3, width), tok.pad_id)
    cont_mask = torch.zeros((3, width), dtype=torch.long)
    for i, c in enumerate(conts):
        cont_ids[i, : len(c)] = torch.tensor(c)
        cont_mask[i, : len(c)] = 1
    full = IncrementalScorer(model, kind).begin(torch.cat([ids, cont_ids], 1), torch.cat([attn, cont_mask], 1))
    inc = IncrementalScorer(model, kind)
    parts = [inc.begin(ids, attn)]
    for s in range(0, width, chunk):
        parts.append(inc.extend(cont_ids[:, s : s + chunk], cont_mask[:, s : s + chunk]))
    streamed = torch.cat(parts, 1)
    real = torch.cat([attn, cont_mask], 1).bool()
    real[:, 0] = False  # column 0 has no predecessor
    assert torch.allclose(streamed[real], full[real], atol=1e-5, rtol=1e-4)
    assert streamed[real].abs().sum() > 0


def test_rollout_streamed_scores_equal_sequential(models):
    """The same responses (same sampling seed) get the same ref logprobs, values and RM scores whether
    the scorers consumed them chunk by chunk on the scorer thread or in one pass after decoding."""
    tok, actor, ref, critic, rm = models
    results = []
    for stream in (False, True):
        seqs = [Sequence(uid=i, group=i, prompt=p, prompt_ids=tok.encode(p), enqueued_step=0)
                for i, p in enumerate(["ab cd? ", "x. ", "qq rr st. ", "a? "])]
        seqs[2].response_ids, seqs[2].versions = tok.encode("zz y"), [0] * 4  # a carried partial response
        engine = TransformersEngine(tok.eos_id, tok.pad_id)
        engine.sync(actor, 1)
        scorers = {"ref": IncrementalScorer(ref, "logprob"), "critic": IncrementalScorer(critic, "value"),
                   "reward": IncrementalScorer(rm, "reward")}
        out = rollout(engine, scorers, seqs, pad_id=tok.pad_id, units_needed=4, max_new_tokens=12, chunk_size=3,
                      stream=stream, generator=torch.Generator().manual_seed(7))
        results.append({s.seq.uid: s for s in out.samples})
    seq_, str_ = results
    assert seq_.keys() == str_.keys() == {0, 1, 2, 3}
    for uid in seq_:
        a, b = seq_[uid], str_[uid]
        assert a.seq.response_ids == b.seq.response_ids
        assert len(a.old_logprobs) == len(a.seq.response_ids)
        assert torch.allclose(a.old_logprobs, b.old_logprobs, atol=1e-5)
        assert torch.allclose(a.ref_logprobs, b.ref_logprobs, atol=1e-5)
        assert torch.allclose(a.values, b.values, atol=1e-5)
        assert abs(a.score - b.score) < 1e-5


def test_decode_logprobs_match_a_full_forward(models):
    tok, actor, *_ = models
    engine = TransformersEngine(tok.eos_id, tok.pad_id)
    engine.sync(actor, 0)
    ids, attn = left_pad([tok.encode("ab? "), tok.encode("c. ")], tok.pad_id)
    engine.begin(ids, attn, torch.zeros(2, dtype=torch.bool), torch.zeros(2, dtype=torch.long), 10,
                 torch.Generator().manual_seed(0))
    ch = engine.decode(10, 2)
    full_ids, full_attn = torch.cat([ids, ch.ids], 1), torch.cat([attn, ch.mask], 1)
    lp = IncrementalScorer(actor, "logprob").begin(full_ids, full_attn)[:, ids.shape[1] :]
    m = ch.mask.bool()
    assert torch.allclose(lp[m], ch.logprobs[m], atol=1e-5)


def test_inter_step_rollout_trains_first_b_and_defers_the_rest(models):
    tok, actor, ref, critic, rm = models
    seqs = [Sequence(uid=i, group=i, prompt="p", prompt_ids=tok.encode(f"p{i}? "), enqueued_step=0)
            for i in range(6)]
    engine = TransformersEngine(tok.eos_id, tok.pad_id)
    engine.sync(actor, 3)
    scorers = {"ref": IncrementalScorer(ref, "logprob"), "reward": IncrementalScorer(rm, "reward")}
    out = rollout(engine, scorers, seqs, pad_id=tok.pad_id, units_needed=2, max_new_tokens=40, chunk_size=4,
                  stream=True, generator=torch.Generator().manual_seed(1))
    assert len(out.samples) == 2
    assert len(out.deferred) == 4
    finished_lens = sorted(len(s.seq.response_ids) for s in out.samples)
    for d in out.deferred:  # deferred rows keep their tokens and the version that generated them
        assert d.versions == [3] * len(d.response_ids)
        if not d.finished:
            assert len(d.response_ids) >= finished_lens[-1] - 1
    assert all(s.seq.finished for s in out.samples)
