"""Streaming oracles: what the incremental (KV-cached, chunked) scorers and a streamed rollout emit equals a
plain full-sequence forward of the same `transformers` model, one unpadded row at a time:

- reference logprobs: `log_softmax(model(ids).logits / T)` at the position before each token,
- critic values: the head on `base_model(ids).last_hidden_state` at the position before each token
  (V(s_t), the state *before* token t),
- reward: the `*ForSequenceClassification` logit of the whole sequence (and of every prefix).

The oracle never pads, never caches and never chunks, so a layout or carry-over mistake in the scorer (a
column off by one at a chunk boundary, a position shifted by left padding, V(s_t+1) returned as V(s_t))
shows up as a difference.
"""

from __future__ import annotations

import pytest
import torch

from training.inputs.tokenizer import make_tokenizer
from training.job.config import ModelConfig
from training.models import build_causal_lm, build_scorer
from training.rollout.engine import IncrementalScorer, TransformersEngine, left_pad
from training.rollout.streaming import Sequence, rollout

ATOL = 1e-5


def tiny(arch: str) -> ModelConfig:
    return ModelConfig(arch=arch, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64)


@pytest.fixture(scope="module", params=["llama", "gpt2"])
def models(request):
    torch.manual_seed(1)
    tok = make_tokenizer()
    cfg = tiny(request.param)
    actor = build_causal_lm(cfg, tok, 128).eval()
    # A random-weight model almost never samples EOS (1 in 259); raise its logit so rows finish at different
    # columns. The hook is part of the model: the oracle's plain forward goes through it too.
    eos_bonus = torch.zeros(tok.vocab_size)
    eos_bonus[tok.eos_id] = 3.5
    actor.get_output_embeddings().register_forward_hook(lambda _m, _i, logits: logits + eos_bonus)
    return tok, actor, build_scorer(cfg, tok, 128).eval(), build_scorer(cfg, tok, 128).eval(), \
        build_causal_lm(cfg, tok, 128).eval()


@torch.no_grad()
def plain_logprobs(lm, row: list[int], temperature: float = 1.0) -> torch.Tensor:
    """out[c] = log p(row[c] | row[:c]) for c >= 1 (out[0] = nan: no predecessor)."""
    logits = lm(torch.tensor([row])).logits[0] / temperature
    lp = torch.log_softmax(logits[:-1], -1).gather(-1, torch.tensor(row[1:])[:, None]).squeeze(-1)
    return torch.cat([torch.tensor([float("nan")]), lp])


@torch.no_grad()
def plain_values(critic, row: list[int]) -> torch.Tensor:
    """out[c] = V(row[:c]) = head(hidden at c - 1) for c >= 1."""
    hidden = critic.base_model(torch.tensor([row])).last_hidden_state[0]
    return torch.cat([torch.tensor([float("nan")]), critic.score(hidden[:-1]).squeeze(-1)])


@torch.no_grad()
def plain_prefix_rewards(rm, row: list[int]) -> torch.Tensor:
    """out[c] = the sequence-classification logit of row[:c + 1] (what the RM would say if it ended there)."""
    return torch.tensor([float(rm(torch.tensor([row[: c + 1]])).logits[0, 0]) for c in range(len(row))])


_plain_cache: dict = {}


def plain(kind: str, model, row: list[int]) -> torch.Tensor:
    key = (kind, model, tuple(row))  # chunk sizes share one oracle per row (the key keeps the model alive)
    if key not in _plain_cache:
        fn = {"logprob": plain_logprobs, "value": plain_values, "reward": plain_prefix_rewards}[kind]
        _plain_cache[key] = fn(model, row)
    return _plain_cache[key]


def _layout(tok):
    """Left-padded prefixes of different lengths (the third carries a partial response, as a deferred
    sequence does on the next step) and continuations that end at different columns (rows finish early)."""
    prefixes = [tok.encode("ab cd? "), tok.encode("x. "), tok.encode("long one here? ") + tok.encode("abc")]
    conts = [tok.encode("hello world, more"), tok.encode("hi"), tok.encode("a bb ccc")]
    return prefixes, conts


def _stream(scorer: IncrementalScorer, prefixes, conts, chunk: int, pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    ids, attn = left_pad(prefixes, pad)
    width = max(len(c) for c in conts)
    cont_ids = torch.full((len(conts), width), pad)
    cont_mask = torch.zeros((len(conts), width), dtype=torch.long)
    for i, c in enumerate(conts):
        cont_ids[i, : len(c)] = torch.tensor(c)
        cont_mask[i, : len(c)] = 1
    parts = [scorer.begin(ids, attn)]
    for s in range(0, width, chunk):
        parts.append(scorer.extend(cont_ids[:, s : s + chunk], cont_mask[:, s : s + chunk]))
    return torch.cat(parts, 1), torch.cat([attn, cont_mask], 1)


@pytest.mark.parametrize("kind", ["logprob", "value", "reward"])
@pytest.mark.parametrize("chunk", [1, 2, 3, 5, 64])
def test_streamed_outputs_equal_a_plain_forward(models, kind, chunk):
    tok, _, critic, rm, ref = models
    model = {"logprob": ref, "value": critic, "reward": rm}[kind]
    prefixes, conts = _layout(tok)
    out, mask = _stream(IncrementalScorer(model, kind), prefixes, conts, chunk, tok.pad_id)
    for i, (p, c) in enumerate(zip(prefixes, conts, strict=True)):
        row = p + c
        cols = mask[i].nonzero().squeeze(-1)  # the row's real columns, in order
        assert len(cols) == len(row)
        want = plain(kind, model, row)
        got = out[i, cols]
        first = 0 if kind == "reward" else 1  # a logprob/value needs a predecessor token
        assert torch.allclose(got[first:], want[first:], atol=ATOL), (i, kind, chunk)
        if kind == "reward":  # the row's score: the sequence-classification logit of the whole sequence
            with torch.no_grad():
                seq_logit = float(rm(torch.tensor([row])).logits[0, 0])
            assert float(got[-1]) == pytest.approx(seq_logit, abs=ATOL)


def test_sequence_classification_pools_the_last_real_token_of_a_padded_batch(models):
    """The reward read at a row's last real column equals the HF model's own pooled logits on a right-padded
    batch (the path `rm(ids, attention_mask).logits` takes): same model, same score, padding or not."""
    tok, _, _, rm, _ = models
    prefixes, conts = _layout(tok)
    out, mask = _stream(IncrementalScorer(rm, "reward"), prefixes, conts, 3, tok.pad_id)
    rows = [p + c for p, c in zip(prefixes, conts, strict=True)]
    width = max(map(len, rows))
    ids = torch.tensor([r + [tok.pad_id] * (width - len(r)) for r in rows])
    attn = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
    with torch.no_grad():
        pooled = rm(input_ids=ids, attention_mask=attn).logits[:, 0]
    last = torch.tensor([int(m.nonzero().max()) for m in mask])
    assert torch.allclose(out[torch.arange(len(rows)), last], pooled, atol=ATOL)


@pytest.mark.parametrize("stream", [True, False])
@pytest.mark.parametrize("chunk", [1, 4])
def test_rollout_samples_equal_a_plain_forward(models, stream, chunk):
    """A real rollout (sampled tokens, rows finishing at different times, a carried-over partial response,
    B of B+Delta trained): every sample's actor logprobs, reference logprobs, values and score equal a plain
    forward over its prompt + response."""
    tok, actor, critic, rm, ref = models
    seqs = [Sequence(uid=i, group=i, prompt=p, prompt_ids=tok.encode(p), enqueued_step=0)
            for i, p in enumerate(["ab cd? ", "x. ", "qq rr st. ", "a? ", "mm? "])]
    seqs[2].response_ids, seqs[2].versions = tok.encode("zz y"), [0] * 4  # deferred from the step before
    engine = TransformersEngine(tok.eos_id, tok.pad_id)
    engine.sync(actor, 1)
    scorers = {"ref": IncrementalScorer(ref, "logprob"), "critic": IncrementalScorer(critic, "value"),
               "reward": IncrementalScorer(rm, "reward")}
    out = rollout(engine, scorers, seqs, pad_id=tok.pad_id, units_needed=4, max_new_tokens=10, chunk_size=chunk,
                  stream=stream, generator=torch.Generator().manual_seed(3))
    assert len(out.samples) == 4
    assert len({len(s.seq.response_ids) for s in out.samples}) > 1  # ragged: padding is exercised
    assert any(s.seq.uid == 2 for s in out.samples) or any(d.uid == 2 for d in out.deferred)
    for s in out.samples:
        row = s.seq.prompt_ids + s.seq.response_ids
        resp = slice(len(s.seq.prompt_ids), len(row))  # response token t sits at column P + t
        assert torch.allclose(s.old_logprobs, plain_logprobs(actor, row)[resp], atol=ATOL), s.seq.uid
        assert torch.allclose(s.ref_logprobs, plain_logprobs(ref, row)[resp], atol=ATOL), s.seq.uid
        assert torch.allclose(s.values, plain_values(critic, row)[resp], atol=ATOL), s.seq.uid
        with torch.no_grad():
            assert s.score == pytest.approx(float(rm(torch.tensor([row])).logits[0, 0]), abs=ATOL)


def test_deferred_continuation_across_two_rollouts_equals_a_plain_forward(models):
    """Inter-step overlap: a sequence that was not finished in rollout 1 is continued in rollout 2 under new
    weights (here: another model plays the updated actor). Its logprobs in rollout 2 are recomputed for the
    whole response under the new weights, and its scores equal a plain forward of the final sequence."""
    tok, actor, critic, rm, ref = models
    seqs = [Sequence(uid=i, group=i, prompt=p, prompt_ids=tok.encode(p), enqueued_step=0)
            for i, p in enumerate(["ab cd? ", "x. ", "qq rr st. ", "a? ", "mm? ", "k? "])]
    scorers = {"ref": IncrementalScorer(ref, "logprob"), "critic": IncrementalScorer(critic, "value"),
               "reward": IncrementalScorer(rm, "reward")}
    engine = TransformersEngine(tok.eos_id, tok.pad_id)
    engine.sync(actor, 0)
    first = rollout(engine, scorers, seqs, pad_id=tok.pad_id, units_needed=1, max_new_tokens=12, chunk_size=3,
                    stream=True, generator=torch.Generator().manual_seed(0))
    carried = [s for s in first.deferred if s.response_ids and not s.finished]
    assert carried, "rollout 1 left no partial response to continue"
    new_actor = ref  # a different set of weights: the "updated" policy
    engine.sync(new_actor, 1)
    second = rollout(engine, scorers, first.deferred, pad_id=tok.pad_id, units_needed=len(first.deferred),
                     max_new_tokens=12, chunk_size=3, stream=True, generator=torch.Generator().manual_seed(1))
    continued = [s for s in second.samples if s.seq.uid in {c.uid for c in carried} and set(s.seq.versions) == {0, 1}]
    assert continued
    for s in continued:
        row = s.seq.prompt_ids + s.seq.response_ids
        resp = slice(len(s.seq.prompt_ids), len(row))
        assert torch.allclose(s.old_logprobs, plain_logprobs(new_actor, row)[resp], atol=ATOL)
        assert torch.allclose(s.ref_logprobs, plain_logprobs(ref, row)[resp], atol=ATOL)
        assert torch.allclose(s.values, plain_values(critic, row)[resp], atol=ATOL)
        with torch.no_grad():
            assert s.score == pytest.approx(float(rm(torch.tensor([row])).logits[0, 0]), abs=ATOL)
