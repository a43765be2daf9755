"""A tenant's function is called exactly as TRL 1.16's GRPOTrainer calls a reward function
(`_calculate_rewards`): by keyword, `fn(prompts=, completions=, completion_ids=, **columns, trainer_state=,
log_metric=, log_extra=)`; completions as assistant messages when the prompts are chat messages; async functions
awaited; a list of functions with weights summed NaN-aware per sample; `log_metric` reaching the step's metrics.
The functions below copy the shapes of TRL's documented examples (written here by hand) and run unchanged. A
signature that cannot take the call is bad input, found before any work, with the fix in one line."""

from __future__ import annotations

import math
import textwrap
from pathlib import Path

import pytest

from common.errors import BadInput
from eval.attribution import TenantCodeError
from training.inputs.scorers import RewardFunctions, check_signature
from training.inputs.tenant_code import FunctionRef, TenantFunctionPool, parse_ref
from training.job.config import FunctionRewardConfig

TRL_STYLE = '''
import asyncio
import re

def reward_len(completions, **kwargs):
    """TRL's quick-start reward: completions close to 20 characters."""
    return [-abs(20 - len(completion)) for completion in completions]

def format_reward_func(completions, **kwargs):
    """TRL's conversational example: reads each completion's assistant message."""
    pattern = r"^<think>.*?</think><answer>.*?</answer>$"
    completion_contents = [completion[0]["content"] for completion in completions]
    matches = [re.match(pattern, content) for content in completion_contents]
    return [1.0 if match else 0.0 for match in matches]

def keyword_only(*, prompts, completions, completion_ids, trainer_state, log_metric, log_extra, answer):
    log_metric("ids_seen", sum(len(ids) for ids in completion_ids))
    log_extra("golden", answer)
    return [float(c == a) + 10 * trainer_state.global_step for c, a in zip(completions, answer)]

async def judge(prompts, completions, **kwargs):
    await asyncio.sleep(0.01)
    return [float(len(c)) for c in completions]

def half(completions, **kwargs):
    kwargs["log_metric"]("calls", 1.0)
    return [None if c.startswith("skip") else 0.5 for c in completions]

def raises_on_bad(completions, **kwargs):
    if any(c.startswith("bad") for c in completions):
        raise ValueError("cannot score a bad completion")
    return [1.0] * len(completions)

def positional_only(prompts, completions):
    return [0.0] * len(completions)

def needs_a_column(completions, solution, **kwargs):
    return [0.0] * len(completions)
'''


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("trl")
    (path / "trl_rewards.py").write_text(textwrap.dedent(TRL_STYLE))
    return path


@pytest.fixture(scope="module")
def pool(folder):
    with TenantFunctionPool(folder, workers=1, memory_mb=1024) as p:
        yield p


def ref(folder: Path, name: str) -> FunctionRef:
    return parse_ref(f"trl_rewards.py:{name}", folder, "reward.ref")


def test_a_trl_reward_with_kwargs_runs_unchanged(pool, folder):
    got = pool.call(ref(folder, "reward_len"), ["p", "q"], ["x" * 20, "x" * 25], {"answer": ["a", "b"]},
                    timeout_s=30)
    assert got.scores == [0.0, -5.0]


def test_keyword_only_names_every_keyword_and_sees_the_step_the_ids_and_columns(pool, folder):
    got = pool.call(ref(folder, "keyword_only"), ["p", "q"], ["7", "8"], {"answer": ["7", "9"]}, timeout_s=30,
                    completion_ids=[[1, 2, 3], [4]], step=3)
    assert got.scores == [31.0, 30.0] and got.metrics == {"ids_seen": 4.0}


def test_chat_prompts_get_assistant_message_completions(pool, folder):
    chat = [[{"role": "user", "content": "think, then answer"}]] * 2
    got = pool.call(ref(folder, "format_reward_func"), chat, ["<think>hm</think><answer>4</answer>", "4"], {},
                    timeout_s=30)
    assert got.scores == [1.0, 0.0]
    # string prompts: completions stay strings, as in TRL, where this function raises
    plain = pool.call(ref(folder, "format_reward_func"), ["p"], ["<think>hm</think><answer>4</answer>"], {},
                      timeout_s=30)
    assert plain.scores == [None] and plain.errors[0].error.startswith("TypeError: string indices")


def test_an_async_function_is_awaited(pool, folder):
    assert pool.call(ref(folder, "judge"), ["p", "q"], ["ab", "abc"], {}, timeout_s=30).scores == [2.0, 3.0]


def rewards(folder, pool, names, weights=None, max_error_frac=0.01) -> RewardFunctions:
    settings = FunctionRewardConfig(kind="function", ref=[f"trl_rewards.py:{n}" for n in names], weights=weights,
                                    max_error_frac=max_error_frac)
    return RewardFunctions(settings, str(folder), lambda: pool)


def test_a_weighted_list_is_summed_nan_aware_as_trl_does(pool, folder):
    combined = rewards(folder, pool, ["reward_len", "half"], weights=[2.0, -4.0])
    got = combined(["p"] * 3, ["x" * 18, "skip" + "x" * 16, "x" * 20], {})
    # TRL: nansum(w * r) per sample; a function's None is NaN and left out of the sum
    assert got.scores == [2 * -2 + -4 * 0.5, 2 * 0.0, 2 * 0 + -4 * 0.5]
    assert got.metrics["reward_fn/reward_len/mean"] == pytest.approx(-2 / 3)
    assert got.metrics["reward_fn/half/mean"] == 0.5 and got.metrics["reward_fn/calls"] == 1.0
    alone = rewards(folder, pool, ["half", "half"])  # every function gave None: no reward (TRL's NaN row)
    assert alone(["p"], ["skip"], {}).scores == [None]
    assert math.isnan(alone(["p"], ["skip"], {}).metrics["reward_fn/half_0/mean"])
    with pytest.raises(ValueError, match="reward.weights has 1 weight for 2 functions"):
        FunctionRewardConfig(kind="function", ref=["a.py:f", "b.py:g"], weights=[1.0])


def test_max_error_frac_at_its_boundary(pool, folder):
    """0.25 of a batch of 8 is 2 samples: 2 raising keep the job running, 3 fail it."""
    combined = rewards(folder, pool, ["raises_on_bad"], max_error_frac=0.25)
    got = combined(["p"] * 8, ["bad"] * 2 + ["good"] * 6, {}, step=4)
    assert got.scores == [None, None] + [1.0] * 6 and len(got.failures) == 2
    with pytest.raises(TenantCodeError, match=r"raised on 37.5% of samples \(3 of 8\) at step 5"):
        combined(["p"] * 8, ["bad"] * 3 + ["good"] * 5, {}, step=4)


@pytest.mark.parametrize("name, columns, words", [
    ("positional_only", [], "does not take completion_ids, trainer_state, log_metric, log_extra: add **kwargs to its "
                            "parameters, e.g. def positional_only(completions, **kwargs)"),
    ("needs_a_column", ["answer"], "needs solution, which it is not called with (neither one of TRL's keywords nor a "
                                   "column: answer): give it a default or name a column"),
    ("keyword_only", [], "needs answer, which it is not called with"),
])
def test_a_signature_that_cannot_take_the_call_is_bad_input_before_any_work(pool, folder, name, columns, words):
    with pytest.raises(BadInput) as static:  # the request's check: read with ast, never imported here
        check_signature(ref(folder, name), columns)
    assert words in str(static.value) and "\n" not in str(static.value)
    assert str(static.value).startswith(f"reward.ref: trl_rewards.py: {name}(")
    with pytest.raises(BadInput) as loaded:  # the worker's check when the job starts: the same words
        pool.check(ref(folder, name), timeout_s=30, role="reward function", columns=columns)
    assert words in str(loaded.value)


@pytest.mark.parametrize("name", ["reward_len", "format_reward_func", "judge", "half"])
def test_trl_shaped_signatures_pass_both_checks(pool, folder, name):
    check_signature(ref(folder, name), ["answer"])
    pool.check(ref(folder, name), timeout_s=30, role="reward function", columns=["answer"])
