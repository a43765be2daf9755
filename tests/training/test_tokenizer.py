"""The task's BPE tokenizer (training/inputs/tokenizer.py): size as configured, a real compression of the task's text,
lossless round trips, the same vocabulary every time, and the parameter count that uses it."""

import numpy as np
import pytest

from training.inputs import tokenizer as bpe
from training.inputs.synthetic_task import corpus_response, make_prompts
from training.inputs.tokenizer import make_tokenizer
from training.job.config import ModelConfig, TaskConfig, parameter_count, vocab_size
from training.models import build_causal_lm, format_prompt

VOCAB = 3000
CHARS = 400_000  # a smaller text than the real 4M keeps the test to seconds; 3000 ids need far fewer merges


@pytest.fixture(scope="module")
def task():
    return TaskConfig(tokenizer="bpe", vocab_size=VOCAB, length_dist="lognormal", short_mean_len=300,
                      long_mean_len=300)


@pytest.fixture(scope="module")
def tok(task, tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setattr(bpe, "CORPUS_CHARS", CHARS)
    yield make_tokenizer(None, task, tmp_path_factory.mktemp("cache"))
    mp.undo()


def test_size_special_ids_and_compression(tok, task):
    assert tok.vocab_size == VOCAB
    assert len({tok.pad_id, tok.eos_id}) == 2 and tok.eos_id is not None
    rng = np.random.default_rng(7)
    prompts = make_prompts(task, 3).train
    texts = [corpus_response(prompts[i], task, rng) for i in range(200)]
    chars = sum(len(t) for t in texts)
    tokens = sum(len(tok.encode(t)) for t in texts)
    assert chars / tokens > 2.0  # merges that the task's text uses, not a byte vocabulary padded to size


def test_round_trip_on_the_tasks_own_text(tok, task):
    """Text from the task's generator (training/inputs/synthetic_task.py, not the tokenizer's bulk copy of it) decodes
    to itself."""
    rng = np.random.default_rng(11)
    prompts = make_prompts(task, 5)
    for p in prompts.train[:100] + prompts.heldout[:50]:
        for text in (format_prompt(p), p, corpus_response(p, task, rng)):
            assert tok.decode(tok.encode(text)) == text
    ids = tok.encode("kol brane? ab cd")
    assert tok.decode(ids + [tok.eos_id, tok.pad_id]) == "kol brane? ab cd"  # specials are skipped


def test_the_same_config_gives_the_same_vocabulary(tok, task, tmp_path, monkeypatch):
    """Trained again from scratch (another cache), and reloaded from the cache: the same ids for the same text."""
    monkeypatch.setattr(bpe, "CORPUS_CHARS", CHARS)
    again = make_tokenizer(None, task, tmp_path)
    assert again.hf.get_vocab() == tok.hf.get_vocab()
    assert len(list(tmp_path.glob("bpe-*.json"))) == 1
    reloaded = make_tokenizer(None, task, tmp_path)
    text = corpus_response("ab cd?", task, np.random.default_rng(3))
    assert reloaded.encode(text) == again.encode(text)
    assert bpe.tokenizer_key(task) != bpe.tokenizer_key(task.model_copy(update={"vocab_size": VOCAB + 1}))


def test_parameter_count_uses_the_configured_vocabulary(tok, task):
    """The memory estimate counts the BPE's embedding, checked against the model built with that tokenizer."""
    assert vocab_size(task) == VOCAB and vocab_size(TaskConfig()) == 259
    mc = ModelConfig(arch="qwen2", hidden_size=32, num_layers=1, num_heads=4, num_kv_heads=2, intermediate_size=48)
    model = build_causal_lm(mc, tok, 100)
    assert parameter_count(mc, 100, vocab_size(task)) == sum(p.numel() for p in model.parameters())
