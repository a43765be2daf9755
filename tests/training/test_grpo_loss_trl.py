"""Our GRPO loss (training/algorithms/core_algos.py `policy_loss`, token-level mean, k3 KL in the loss) equals TRL's
own.

A real `trl.GRPOTrainer` (TRL 1.16) is built on the CPU around a tiny random-weight Llama and ByT5's byte tokenizer
(nothing is downloaded: the policy is saved to a temporary folder first, because with beta > 0 TRL builds its
reference model from the policy's `name_or_path`). Its `_compute_loss(model, inputs)` is handed prompts, right-padded
completions, per-sequence advantages, perturbed old log-probs (so the ratio differs from 1 and some tokens clip, on
both sides) and reference log-probs. Our side: the same model's per-token log-probs from a plain forward pass
(logits / temperature, log_softmax, gather: what training/algorithms/update.py does), then `policy_loss` with kl_coef =
beta. The loss values and every parameter's gradient must agree.

TRL settings that the match depends on, each asserted below so that a TRL upgrade changing one fails by name:
loss_type "dapo" (sum over the batch's tokens / num_items_in_batch: with one process, one accumulation step and
num_items_in_batch = the mask's token count, a token-level masked mean), epsilon 0.2 on both sides, token-level
importance sampling, no entropy mask or bonus, no vLLM importance weights, and `use_bias_correction_kl=False`.
TRL 1.16 defaults to `use_bias_correction_kl=True`: the k3 term is multiplied by the (differentiable) ratio
pi / pi_old, which changes the KL gradient even on-policy. Ours adds kl_coef * k3 unweighted (the GRPO paper's
Eq. 3, TRL before 1.x); `test_trl_default_weights_the_kl_by_the_ratio` pins that difference down exactly.
"""

from __future__ import annotations

import pytest
import torch

from training.algorithms import core_algos as P

trl = pytest.importorskip("trl")

B, PROMPT, T = 4, 5, 8          # 2 prompts x num_generations 2; prompt tokens; completion tokens (right-padded)
LENGTHS = [8, 3, 6, 5]          # real completion tokens per row
ADVANTAGES = [1.0, -0.7, 0.4, -1.3]
CLIP = 0.2


def build_trainer(tmp_path, beta: float, temperature: float, bias_correction_kl: bool = False):
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, ByT5Tokenizer, LlamaConfig
    from trl import GRPOConfig, GRPOTrainer

    torch.manual_seed(0)
    tok = ByT5Tokenizer(extra_ids=0)
    config = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64,
                         pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, bos_token_id=None,
                         tie_word_embeddings=True)
    # with beta > 0 TRL builds the reference model from the policy's name_or_path: give it a local folder
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(tmp_path / "policy")
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "policy", dtype=torch.float32)
    args = GRPOConfig(output_dir=str(tmp_path / "out"), use_cpu=True, bf16=False, report_to=[],
                      num_generations=2, per_device_train_batch_size=2, beta=beta, loss_type="dapo",
                      temperature=temperature, max_completion_length=T, epsilon=CLIP,
                      use_bias_correction_kl=bias_correction_kl)
    trainer = GRPOTrainer(model=model, reward_funcs=lambda completions, **_: [0.0] * len(completions), args=args,
                          train_dataset=Dataset.from_dict({"prompt": ["ab?", "cd.", "ef?", "gh."]}),
                          processing_class=tok)
    # what the training loop sets before each accumulation window (transformers Trainer: len(batch_samples))
    trainer.current_gradient_accumulation_steps = 1
    model.train()
    # the settings the equality rests on (module docstring)
    assert trainer.loss_type == "dapo" and trainer.beta == beta and trainer.temperature == temperature
    assert trainer.epsilon_low == CLIP and trainer.epsilon_high == CLIP
    assert trainer.importance_sampling_level == "token" and trainer.top_entropy_quantile == 1.0
    assert trainer.off_policy_mask_threshold is None and trainer.args.delta is None
    assert not trainer.use_vllm and not trainer._entropy_bonus_enabled and not trainer.aux_loss_enabled
    assert trainer.args.use_bias_correction_kl is bias_correction_kl
    assert trainer.accelerator.num_processes == 1 and trainer.args.steps_per_generation == 1
    return trainer, model


def batch(vocab: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    prompt_ids = torch.randint(3, vocab, (B, PROMPT), generator=g)
    completion_ids = torch.randint(3, vocab, (B, T), generator=g)
    completion_mask = (torch.arange(T)[None, :] < torch.tensor(LENGTHS)[:, None]).long()
    completion_ids = completion_ids.masked_fill(completion_mask == 0, 0)  # pad id after each completion
    return {"prompt_ids": prompt_ids, "prompt_mask": torch.ones_like(prompt_ids),
            "completion_ids": completion_ids, "completion_mask": completion_mask,
            "advantages": torch.tensor(ADVANTAGES)}


def our_logprobs(model, inputs, temperature: float) -> torch.Tensor:
    """log pi(completion token t | prompt + tokens before t) from a plain forward pass, as
    training/algorithms/update.py:
    logits / temperature, log_softmax, gather."""
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
    att = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
    logits = model(input_ids=ids, attention_mask=att).logits[:, PROMPT - 1: PROMPT - 1 + T].float() / temperature
    return torch.log_softmax(logits, -1).gather(-1, inputs["completion_ids"][..., None]).squeeze(-1)


#: log pi - log pi_old per token (row b, token t: OFFSETS[(t + b) % 8]): ratios exp(+-0.4) = 1.49 / 0.67 clip on
#: either side (row 0, advantage > 0, clips above at t = 0; row 1, advantage < 0, below at t = 0), the rest do not
OFFSETS = [0.4, -0.4, 0.1, -0.05, 0.3, -0.3, 0.0, 0.15]


def shifted(lp: torch.Tensor, offsets: list[float]) -> torch.Tensor:
    """lp - offsets[(t + b) % len(offsets)] for row b, token t."""
    n = len(offsets)
    idx = (torch.arange(lp.shape[1])[None, :] + torch.arange(lp.shape[0])[:, None]) % n
    return (lp.detach() - torch.tensor(offsets)[idx]).contiguous()


def grads(model) -> dict[str, torch.Tensor]:
    out = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return out


def both_losses(tmp_path, beta: float, temperature: float, bias_correction_kl: bool = False):
    trainer, model = build_trainer(tmp_path, beta, temperature, bias_correction_kl)
    inputs = batch(model.config.vocab_size)
    mask = inputs["completion_mask"].float()
    with torch.no_grad():
        lp0 = our_logprobs(model, inputs, temperature)
    old = shifted(lp0, OFFSETS)
    ref = shifted(lp0, [-0.5, 0.2, 0.6, -0.1, 0.0, 0.3, -0.6])  # k3 > 0 on most tokens
    ratio = (lp0 - old).exp()
    adv = torch.tensor(ADVANTAGES)[:, None].expand(B, T)
    real = mask.bool()
    assert bool(((ratio > 1 + CLIP) & (adv > 0) & real).any()), "no token clipped above"
    assert bool(((ratio < 1 - CLIP) & (adv < 0) & real).any()), "no token clipped below"
    assert bool(((ratio - 1).abs() < CLIP).logical_and(real).any()), "no token inside the clip range"

    model.zero_grad(set_to_none=True)
    trl_loss = trainer._compute_loss(model, {**inputs, "old_per_token_logps": old, "ref_per_token_logps": ref,
                                             "num_items_in_batch": mask.sum()})
    trl_loss.backward()
    trl_grads = grads(model)

    lp = our_logprobs(model, inputs, temperature)
    # TRL's log-probs, from its fused LM head, are our plain forward's (on the real tokens)
    torch.testing.assert_close(lp.detach() * mask, trainer._get_per_token_logps_and_entropies(
        model, torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1),
        torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1), T)[0].detach() * mask,
        atol=1e-5, rtol=1e-5)
    return trainer, model, inputs, lp, old, ref, mask, adv, trl_loss, trl_grads


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("beta", [0.0, 0.04])
def test_policy_loss_equals_trl_grpo_loss(tmp_path, beta, temperature):
    _, model, _, lp, old, ref, mask, adv, trl_loss, trl_grads = both_losses(tmp_path, beta, temperature)
    ours, stats = P.policy_loss(lp, old, adv, mask, CLIP, ref_logprobs=ref if beta else None, kl_coef=beta)
    assert 0.0 < float(stats["clip_frac"]) < 1.0
    assert float(ours.detach()) == pytest.approx(float(trl_loss.detach()), abs=1e-5, rel=1e-5)
    ours.backward()
    our_grads = grads(model)
    assert our_grads.keys() == trl_grads.keys() and len(our_grads) > 10
    for name, g in trl_grads.items():
        torch.testing.assert_close(our_grads[name], g, atol=1e-6, rtol=1e-4, msg=lambda m, n=name: f"{n}: {m}")
    if beta:
        # the KL term is a real share of the loss here, so a KL left out (or mis-signed) cannot hide in the tolerance
        kl_share = beta * float(P.masked_mean(P.k3_kl(lp.detach(), ref), mask))
        assert kl_share > 100 * 1e-5


def test_trl_default_weights_the_kl_by_the_ratio(tmp_path):
    """TRL 1.16's default `use_bias_correction_kl=True`: its loss is our surrogate plus beta * mean(k3 * ratio), the
    ratio pi / pi_old carrying gradient; ours is the surrogate plus beta * mean(k3) (docs: the GRPO paper's term)."""
    beta = 0.04
    _, model, _, lp, old, ref, mask, adv, trl_loss, trl_grads = both_losses(tmp_path, beta, 1.0,
                                                                            bias_correction_kl=True)
    surrogate, _ = P.policy_loss(lp, old, adv, mask, CLIP)
    weighted = surrogate + beta * P.masked_mean(P.k3_kl(lp, ref) * (lp - old).exp(), mask)
    assert float(weighted.detach()) == pytest.approx(float(trl_loss.detach()), abs=1e-5, rel=1e-5)
    weighted.backward()
    for name, g in grads(model).items():
        torch.testing.assert_close(g, trl_grads[name], atol=1e-6, rtol=1e-4)
    ours, _ = P.policy_loss(lp.detach(), old, adv, mask, CLIP, ref_logprobs=ref, kl_coef=beta)
    assert abs(float(ours) - float(trl_loss.detach())) > 1e-4  # the two defaults really differ on this batch
