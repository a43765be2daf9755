"""GSM8K rewards: lm-evaluation-harness's two `gsm8k` scores, as reward functions.

A job that trains on GSM8K-format data (question / answer, the answer ending in `#### N`) should be rewarded by the
very score the world reports it on, so the extraction and comparison here are lm-eval's, to the character
(lm_eval/tasks/gsm8k/gsm8k.yaml, version 3.0, and lm_eval/filters/extraction.py's RegexFilter):

- strict-match: the first match of `#### (\\-?[0-9\\.\\,]+)`;
- flexible-extract: the last match of `(-?[$0-9.,]{2,})|(-?[0-9]+)` (two groups: findall gives tuples, of which
  the first non-empty group counts);
- the extraction is `.strip()`ed; no match is the fallback "[invalid]", which scores 0;
- exact_match then applies `regexes_to_ignore` (`,`  `\\$`  `(?s).*#### `  `\\.$`, in that order, each with
  re.sub) and `ignore_case` to both the extraction and the reference, the reference being the whole `answer` text,
  and compares the strings: "7.50" is not "7.5", "5." is "5".

Functions follow TRL's reward signature, fn(prompts, completions, **columns) -> list[float]; the gold answer is
the `answer` column. Completions may be plain strings or chat messages (the last message's content is scored).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

#: lm-eval's RegexFilter fallback when nothing matches
INVALID = "[invalid]"
#: filter "strict-match": regex, then take_first (group_select 0: the first match)
STRICT_PATTERN = re.compile(r"#### (\-?[0-9\.\,]+)")
#: filter "flexible-extract": regex with group_select -1 (the last match), then take_first
FLEXIBLE_PATTERN = re.compile(r"(-?[$0-9.,]{2,})|(-?[0-9]+)")
#: exact_match's regexes_to_ignore, applied in this order to prediction and reference alike
REGEXES_TO_IGNORE = (",", r"\$", r"(?s).*#### ", r"\.$")


def _select(pattern: re.Pattern[str], text: str, group_select: int) -> str | None:
    """RegexFilter.apply on one response: findall, pick a match, first non-empty group of a tuple, strip."""
    matches = pattern.findall(text)
    if not matches:
        return None
    match = matches[group_select]
    if isinstance(match, tuple):
        groups = [m for m in match if m]
        if not groups:
            return None
        match = groups[0]
    return match.strip()


def extract_strict(text: str) -> str | None:
    """The strict-match extraction (the number after the first '#### '), None where lm-eval says "[invalid]"."""
    return _select(STRICT_PATTERN, text, 0)


def extract_flexible(text: str) -> str | None:
    """The flexible-extract extraction (the last number-like run), None where lm-eval says "[invalid]"."""
    return _select(FLEXIBLE_PATTERN, text, -1)


def normalize(number_text: str) -> str:
    """exact_match's regexes_to_ignore and ignore_case: commas, '$', everything through the last '#### ', then one
    final '.' removed, lower-cased."""
    for pattern in REGEXES_TO_IGNORE:
        number_text = re.sub(pattern, "", number_text)
    return number_text.lower()


def target(answer_text: str) -> str:
    """The reference as lm-eval compares it: a GSM8K answer's whole text normalised, i.e. the number after '#### '
    without commas, '$' or a final '.' (no strip: lm-eval does not strip the reference)."""
    return normalize(answer_text)


def _text(completion: Any) -> str:
    if isinstance(completion, str):
        return completion
    if isinstance(completion, Sequence) and completion and isinstance(completion[-1], dict):
        return str(completion[-1].get("content", ""))
    return str(completion)


def _score(extract, completions: Sequence[Any], answer: Sequence[str]) -> list[float]:
    if len(completions) != len(answer):
        raise ValueError(f"{len(completions)} completions but {len(answer)} answers")
    out = []
    for completion, gold in zip(completions, answer, strict=True):
        got = extract(_text(completion))
        out.append(float(got is not None and normalize(got) == target(gold)))
    return out


def strict_match(prompts: Sequence[Any], completions: Sequence[Any], answer: Sequence[str], **_: Any) -> list[float]:
    """1.0 where the completion's first '#### N' equals the answer's, else 0.0 (lm-eval gsm8k strict-match)."""
    return _score(extract_strict, completions, answer)


def flexible_extract(prompts: Sequence[Any], completions: Sequence[Any], answer: Sequence[str],
                     **_: Any) -> list[float]:
    """1.0 where the completion's last number equals the answer's, else 0.0 (lm-eval gsm8k flexible-extract)."""
    return _score(extract_flexible, completions, answer)
