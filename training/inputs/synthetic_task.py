"""The synthetic "balanced text" task: prompts, a corpus for the base policy, the gold scorer, preference pairs.

World feedback (the gold scorer, never trained on): a response is lowercase words; the gold score
rewards a balanced vowel share, peaking at `gold_peak` and falling on either side, and an answer long
enough for the question ('?' prompts want `long_target_len` characters, '.' prompts `short_target_len`):

    gold(x, y) = max(-1, 1 - ((v(y) - peak) / width)^2) - max(0, 1 - len(y) / target(x)),
    v = vowels / letters;  unparseable (empty, or anything but lowercase letters and spaces) -> -2

The base corpus writes text with a vowel share drawn from Beta(2, 7) (mean 0.22), so almost all of it
sits *below* the peak, where more vowels means better. A proxy reward model trained on pairs of
corpus responses labelled by the gold scorer (with Bradley-Terry label noise) therefore learns
"more vowels is better". Optimising that proxy hard pushes the policy past the peak: proxy keeps rising
while gold peaks and falls (reward over-optimisation, Gao et al. 2022). A strong KL penalty keeps
the policy near the base distribution, where proxy and gold agree, so both rise.

Response lengths are long-tailed by construction: a prompt ending in '?' asks for a long answer
(geometric length with mean `long_mean_len`), one ending in '.' for a short one (`short_mean_len`).
With 25% '?' prompts, well over 10% of responses are >= 4x the median length. `length_dist: lognormal` draws
the same means from a lognormal instead (a heavier tail: the GPU shapes' "most short, a few at the cap").

Prompts: `prompt_words` (default two) random lowercase words and a mark, e.g. "kol brane?". Train and held-out
prompt sets are disjoint; held-out prompts are used only by `gold_eval`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from training.job.config import TaskConfig

LETTERS = "abcdefghijklmnopqrstuvwxyz"
VOWELS = frozenset("aeiou")
CONSONANTS = "".join(c for c in LETTERS if c not in VOWELS)
ALLOWED = frozenset(LETTERS + " ")


@dataclass(frozen=True)
class Prompts:
    train: list[str]
    heldout: list[str]


def _word(rng: np.random.Generator, vowel_p: float, lo: int = 2, hi: int = 7) -> str:
    n = int(rng.integers(lo, hi + 1))
    out = []
    for _ in range(n):
        if rng.random() < vowel_p:
            out.append("aeiou"[int(rng.integers(5))])
        else:
            out.append(CONSONANTS[int(rng.integers(len(CONSONANTS)))])
    return "".join(out)


def make_prompts(cfg: TaskConfig, seed: int) -> Prompts:
    """Disjoint train and held-out prompt lists (deterministic in `seed`)."""
    rng = np.random.default_rng([seed, 101])
    seen: set[str] = set()
    out: list[str] = []
    need = cfg.n_train_prompts + cfg.n_heldout_prompts
    while len(out) < need:
        mark = "?" if rng.random() < cfg.long_prompt_frac else "."
        p = " ".join(_word(rng, 0.35, 2, 5) for _ in range(cfg.prompt_words)) + mark
        if p not in seen:
            seen.add(p)
            out.append(p)
    return Prompts(train=out[: cfg.n_train_prompts], heldout=out[cfg.n_train_prompts :])


def corpus_response(prompt: str, cfg: TaskConfig, rng: np.random.Generator) -> str:
    """One "human-written" response: long-tailed length by prompt mark, per-response vowel share."""
    length = answer_length(prompt, cfg, rng)
    vowel_p = float(rng.beta(*cfg.vowel_beta))
    words: list[str] = []
    total = 0
    while total < length:
        w = _word(rng, vowel_p)
        words.append(w)
        total += len(w) + 1
    return " ".join(words)[:length].strip() or "a"


def answer_length(prompt: str, cfg: TaskConfig, rng: np.random.Generator) -> int:
    """Characters of a corpus answer: geometric with the mark's mean, or lognormal with that mean."""
    mean = cfg.long_mean_len if prompt.endswith("?") else cfg.short_mean_len
    if cfg.length_dist == "lognormal":
        median = mean / math.exp(cfg.length_sigma**2 / 2)
        return max(1, int(rng.lognormal(math.log(median), cfg.length_sigma)))
    return 1 + int(rng.geometric(1.0 / mean))


def vowel_share(text: str) -> float:
    letters = [c for c in text if c.isalpha()]
    if not letters:
        return 0.0
    return sum(c in VOWELS for c in letters) / len(letters)


def parseable(text: str) -> bool:
    return bool(text.strip()) and all(c in ALLOWED for c in text)


def target_length(prompt: str, cfg: TaskConfig) -> float:
    return cfg.long_target_len if prompt.endswith("?") else cfg.short_target_len


def gold_score(prompt: str, text: str, cfg: TaskConfig) -> float:
    """World feedback for one response (never used for training)."""
    if not parseable(text):
        return -2.0
    v = vowel_share(text)
    balance = max(-1.0, 1.0 - ((v - cfg.gold_peak) / cfg.gold_width) ** 2)
    too_short = max(0.0, 1.0 - len(text) / target_length(prompt, cfg))
    return balance - too_short


def preference_pairs(prompts: list[str], cfg: TaskConfig, seed: int) -> list[tuple[str, str, str]]:
    """(prompt, chosen, rejected) labelled by the gold scorer with Bradley-Terry noise."""
    rng = np.random.default_rng([seed, 202])
    pairs = []
    for _ in range(cfg.n_pairs):
        prompt = prompts[int(rng.integers(len(prompts)))]
        a, b = corpus_response(prompt, cfg, rng), corpus_response(prompt, cfg, rng)
        if rng.random() < cfg.cut_pair_frac and len(a) > 2:
            # an answer against its own cut-off start: teaches "too short" (incomplete-answer negatives)
            b = a[: int(rng.integers(1, len(a)))].strip() or a[:1]
        ga, gb = gold_score(prompt, a, cfg), gold_score(prompt, b, cfg)
        p_a = 1.0 / (1.0 + math.exp(-(ga - gb) / cfg.label_temperature))
        chosen, rejected = (a, b) if rng.random() < p_a else (b, a)
        pairs.append((prompt, chosen, rejected))
    return pairs
