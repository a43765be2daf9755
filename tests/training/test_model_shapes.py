"""Model shapes: grouped-query attention (num_kv_heads) in the built model and in the parameter count."""

import pytest
from pydantic import ValidationError

from training.inputs.tokenizer import make_tokenizer
from training.job.config import ModelConfig, parameter_count
from training.models import build_causal_lm


@pytest.mark.parametrize("arch,hidden,heads,kv_heads,layers,inter", [
    ("llama", 32, 4, None, 2, 48),
    ("llama", 32, 4, 2, 3, 48),
    ("llama", 48, 6, 1, 1, 40),
    ("qwen2", 32, 4, 2, 2, 48),
    ("qwen2", 56, 14, 2, 2, 64),  # the Qwen2-0.5B head layout (14 query heads, 2 key/value heads), narrow
    ("qwen2", 32, 4, 4, 2, 48),
    ("gpt2", 32, 4, 4, 2, 48),
])
def test_parameter_count_is_the_built_models(arch, hidden, heads, kv_heads, layers, inter):
    """The count against transformers' own model (the independent oracle), with and without grouped k/v heads."""
    tok = make_tokenizer()
    mc = ModelConfig(arch=arch, hidden_size=hidden, num_layers=layers, num_heads=heads, num_kv_heads=kv_heads,
                     intermediate_size=inter)
    model = build_causal_lm(mc, tok, 100)
    assert parameter_count(mc, 100, tok.vocab_size) == sum(p.numel() for p in model.parameters())
    if arch != "gpt2":
        assert model.config.num_key_value_heads == (kv_heads or heads)
        k_proj = model.model.layers[0].self_attn.k_proj
        assert tuple(k_proj.weight.shape) == ((kv_heads or heads) * hidden // heads, hidden)


def test_kv_heads_must_divide_the_heads_and_gpt2_has_none():
    with pytest.raises(ValidationError, match=r"num_kv_heads \(3\) must divide num_heads \(4\)"):
        ModelConfig(arch="llama", num_heads=4, num_kv_heads=3)
    with pytest.raises(ValidationError, match=r"num_kv_heads \(2\) must equal num_heads \(4\) for arch gpt2"):
        ModelConfig(arch="gpt2", num_heads=4, num_kv_heads=2)
    assert ModelConfig(arch="gpt2", num_heads=4, num_kv_heads=4).kv_heads == 4


def test_grouped_kv_heads_shrink_the_kv_cache_estimate():
    """The memory estimate's key/value cache scales with kv_heads: a 14-head model with 2 k/v heads holds a 7th of
    the cache of one with 14 (the rest of the estimate unchanged, so the difference is exactly 6/7 of the cache, plus
    the k/v weights of the policy-shaped actor (16 B/param), reference (4 B) and critic (16 B) and the reward model
    (20 B))."""
    from training.job.config import TrainConfig, train_memory_bytes

    def cfg(kv):
        shape = dict(arch="qwen2", hidden_size=56, num_heads=14, num_kv_heads=kv, num_layers=2, intermediate_size=64)
        return TrainConfig(policy=shape, reward=shape)

    full, grouped = cfg(14), cfg(2)
    c = full.ppo
    positions = 32 + 2 * c.max_new_tokens
    # k and v caches of four roles: actor, reference, critic, reward model
    cache_full = 4 * (2 * 2 * 56 * positions * (c.batch_size + full.oppo.delta_max) * 4)
    params_diff = 2 * (2 * 56 * (56 - 8) + 2 * (56 - 8))  # k/v weights and biases, 2 layers, one model
    assert train_memory_bytes(full) - train_memory_bytes(grouped) == pytest.approx(
        cache_full * 6 / 7 + (16.0 + 4.0 + 16.0 + 20.0) * params_diff)


def test_the_real_shape_config_is_qwen2_0_5b():
    """configs/ppo-qwen2-0.5b.yaml: with Qwen2's own vocabulary (151,936) its policy has the parameter count that
    transformers' Qwen2ForCausalLM had in the GPU anchor (494,032,768: ../shared/gpu/anchor-h200.json, params_m),
    an oracle outside this code; it validates, B=64, a 1024 cap, bf16, the BPE of 32k."""
    from pathlib import Path

    import yaml

    from training.job.config import TrainConfig, vocab_size

    raw = yaml.safe_load((Path(__file__).resolve().parents[2] / "configs" / "ppo-qwen2-0.5b.yaml").read_text())
    cfg = TrainConfig.model_validate(raw)
    assert parameter_count(cfg.policy, 4096, 151_936) == 494_032_768
    assert (cfg.ppo.batch_size, cfg.ppo.max_new_tokens, cfg.dtype, cfg.device) == (64, 1024, "bfloat16", "auto")
    assert vocab_size(cfg.task) == 32_000 and cfg.task.length_dist == "lognormal"
