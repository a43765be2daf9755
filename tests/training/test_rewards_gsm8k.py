"""The built-in GSM8K rewards (training/inputs/rewards/gsm8k.py) against answers worked out by hand from lm-eval's
gsm8k task (lm_eval/tasks/gsm8k/gsm8k.yaml v3.0, lm_eval/filters/extraction.py RegexFilter, lm_eval/api/metrics.py
exact_match_hf_evaluate), and the registry (training/inputs/rewards/__init__.py).

Every expected value below was derived by hand from the regexes, not by running the code: strict-match is the first
`#### (\\-?[0-9\\.\\,]+)`, flexible-extract the last `(-?[$0-9.,]{2,})|(-?[0-9]+)`, then `,` `$` and one final `.`
are removed from both sides and the strings compared.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from training.inputs import rewards
from training.inputs.rewards import gsm8k

# --- extraction and normalisation, one lm-eval rule per case ----------------------------------------------------


def test_commas_are_ignored():
    assert gsm8k.extract_strict("#### 1,234") == "1,234"
    assert gsm8k.normalize("1,234") == "1234"
    assert gsm8k.target("So she has 1,234 beads.\n#### 1,234") == "1234"


def test_dollar_and_final_dot_are_ignored_in_the_target_but_strict_does_not_match_a_dollar():
    # the reference "... #### $5." loses '$', everything through '#### ', then the final '.'
    assert gsm8k.target("It costs $5.\n#### $5.") == "5"
    # '$' is not in strict's class [0-9.,-], so "#### $5." gives no strict match: lm-eval's "[invalid]"
    assert gsm8k.extract_strict("#### $5.") is None
    # flexible's first alternative [$0-9.,]{2,} takes "$5." whole
    assert gsm8k.extract_flexible("#### $5.") == "$5."
    assert gsm8k.normalize("$5.") == "5"
    assert gsm8k.flexible_extract([""], ["#### $5."], ["#### 5"]) == [1.0]
    assert gsm8k.strict_match([""], ["#### $5."], ["#### 5"]) == [0.0]


def test_only_one_final_dot_goes():
    assert gsm8k.normalize("7.") == "7"
    assert gsm8k.normalize("7...") == "7.."  # `\.$` matches once, at the very end
    assert gsm8k.extract_flexible("So the answer is 7...") == "7..."
    assert gsm8k.flexible_extract([""], ["So the answer is 7..."], ["#### 7"]) == [0.0]


def test_negative_answer():
    assert gsm8k.extract_strict("#### -3") == "-3"
    # "-3" is one class char after '-': the first alternative needs two, so the second group matches -> tuple
    assert gsm8k.extract_flexible("#### -3") == "-3"
    assert gsm8k.strict_match([""], ["It fell 3 below zero.\n#### -3"], ["#### -3"]) == [1.0]
    assert gsm8k.flexible_extract([""], ["The temperature is -15 degrees."], ["#### -15"]) == [1.0]
    assert gsm8k.flexible_extract([""], ["The temperature is 15 degrees."], ["#### -15"]) == [0.0]


def test_plain_sentence_is_flexible_only():
    text = "The answer is 42."
    assert gsm8k.extract_flexible(text) == "42."  # first alternative: "42." is three class chars
    assert gsm8k.extract_strict(text) is None
    assert gsm8k.flexible_extract([""], [text], ["#### 42"]) == [1.0]
    assert gsm8k.strict_match([""], [text], ["#### 42"]) == [0.0]


def test_reasoning_then_hashes_both_agree():
    text = "3 + 4 = 7 ... #### 7"
    # findall (flexible): "3", "4", "7", "..." (three dots are a first-alternative match), "7": the last is "7"
    assert gsm8k.extract_flexible(text) == "7"
    assert gsm8k.extract_strict(text) == "7"
    assert gsm8k.strict_match([""], [text], ["#### 7"]) == [1.0]
    assert gsm8k.flexible_extract([""], [text], ["#### 7"]) == [1.0]


def test_flexible_takes_the_last_number_strict_the_first_hashes():
    text = "I had 12 apples, ate 3, so 9 left"
    assert gsm8k.extract_flexible(text) == "9"  # the first would be "12"
    assert gsm8k.flexible_extract([""], [text], ["#### 9"]) == [1.0]
    assert gsm8k.flexible_extract([""], [text], ["#### 12"]) == [0.0]
    assert gsm8k.extract_strict("#### 3\n#### 4") == "3"
    assert gsm8k.strict_match([""], ["#### 3\n#### 4"], ["#### 3"]) == [1.0]


def test_strings_are_compared_not_numbers():
    # lm-eval compares the strings after the ignores: "7.50" is not "7.5"
    assert gsm8k.normalize(gsm8k.extract_strict("#### 7.50")) == "7.50"
    assert gsm8k.target("#### 7.5") == "7.5"
    assert gsm8k.strict_match([""], ["#### 7.50"], ["#### 7.5"]) == [0.0]
    assert gsm8k.strict_match([""], ["#### 7.5"], ["#### 7.5"]) == [1.0]


def test_single_digit_is_the_second_group():
    # one digit cannot satisfy {2,}: findall gives ("", "5"), the first non-empty group counts
    assert gsm8k.extract_flexible("She has 5") == "5"
    assert gsm8k.extract_flexible("5") == "5"
    assert gsm8k.flexible_extract([""], ["She has 5"], ["#### 5"]) == [1.0]


def test_no_match_is_invalid_and_never_scores():
    for text in ["", "no numbers here", "#### seven", "-"]:
        assert gsm8k.extract_strict(text) is None
    for text in ["", "no numbers here", "-"]:
        assert gsm8k.extract_flexible(text) is None
    # "[invalid]" is never equal to the target, even a target that normalises to "[invalid]" (lm-eval would count
    # that string equality; a reward must not)
    assert gsm8k.strict_match(["", ""], ["no number", "x"], ["#### 3", "[invalid]"]) == [0.0, 0.0]
    assert gsm8k.flexible_extract(["", ""], ["no number", "x"], ["#### 3", "[invalid]"]) == [0.0, 0.0]


def test_chat_completions_score_the_last_message():
    msgs = [[{"role": "assistant", "content": "2 + 2 = 4\n#### 4"}]]
    assert gsm8k.strict_match([""], msgs, ["#### 4"]) == [1.0]


def test_lengths_must_align():
    with pytest.raises(ValueError):
        gsm8k.strict_match(["", ""], ["#### 1", "#### 2"], ["#### 1"])


# --- real GSM8K-format answers, written by hand -----------------------------------------------------------------

#: (answer text in GSM8K's style, the number lm-eval compares, worked out by hand)
ANSWERS = [
    ("Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n"
     "Natalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May.\n#### 72", "72"),
    ("Tom buys 3*12 = <<3*12=36>>36 pencils.\nAfter giving 10 away he has 36-10 = <<36-10=26>>26 pencils.\n#### 26",
     "26"),
    ("The pants cost 15*2 = $<<15*2=30>>30.\nTogether they cost 15+30 = $<<15+30=45>>45.\n#### 45", "45"),
    ("She earns 40*30 = $<<40*30=1200>>1,200 a month.\n#### 1,200", "1200"),
    ("Each lap is 10/4 = <<10/4=2.5>>2.5 miles.\n#### 2.5", "2.5"),
    ("The tank loses 20-26 = <<20-26=-6>>-6 liters, so the level changes by -6.\n#### -6", "-6"),
]


@pytest.mark.parametrize(("answer", "number"), ANSWERS)
def test_real_format_answers(answer, number):
    assert gsm8k.target(answer) == number
    assert gsm8k.strict_match([""], [answer], [answer]) == [1.0]
    assert gsm8k.flexible_extract([""], [answer], [answer]) == [1.0]


def test_real_format_completions_right_and_wrong():
    answer = ANSWERS[1][0]
    right = "3 packs of 12 is 3*12 = 36 pencils. 36-10 = 26.\n#### 26"
    wrong = "3 packs of 12 is 3*12 = 36 pencils. 36-12 = 24.\n#### 24"
    no_hashes = "3*12 = 36 pencils, minus 10 leaves 26 pencils."
    assert gsm8k.strict_match([""] * 3, [right, wrong, no_hashes], [answer] * 3) == [1.0, 0.0, 0.0]
    assert gsm8k.flexible_extract([""] * 3, [right, wrong, no_hashes], [answer] * 3) == [1.0, 0.0, 1.0]
    # the comma-formatted target matches a completion without the comma, and with it
    big = ANSWERS[3][0]
    assert gsm8k.strict_match([""] * 2, ["#### 1200", "#### 1,200"], [big] * 2) == [1.0, 1.0]


# --- the registry ------------------------------------------------------------------------------------------------


def test_registry_names_and_fallback():
    assert rewards.names() == ["gsm8k:flexible_extract", "gsm8k:strict_match"]
    assert rewards.builtin("gsm8k:strict_match") is gsm8k.strict_match
    assert rewards.builtin("gsm8k:flexible_extract") is gsm8k.flexible_extract
    assert rewards.builtin("rewards.py:score") is None
    assert rewards.builtin("mypkg.mod:fn") is None
    # called as training/inputs/scorers.py calls it: columns as keywords, extra columns ignored
    fn = rewards.builtin("gsm8k:strict_match")
    assert fn(["q"], ["#### 3"], answer=["#### 3"], question=["q"]) == [1.0]


def test_code_hash_is_each_functions_own_code_in_the_module():
    """Each built-in is identified by its own code and what it uses in its module (training/inputs/code_identity.py),
    so the reward and the gate of one module differ, and neither is the whole file's hash."""
    from training.inputs.code_identity import function_identity

    source = Path(gsm8k.__file__).read_bytes()
    strict, flexible = function_identity(source, "strict_match"), function_identity(source, "flexible_extract")
    assert rewards.code_hash("gsm8k:strict_match") == strict and rewards.code_hash("gsm8k:flexible_extract") == flexible
    assert strict != flexible and hashlib.sha256(source).hexdigest()[:16] not in (strict, flexible)
    assert len(strict) == 16
    with pytest.raises(KeyError):
        rewards.code_hash("nope:nothing")
