"""A tenant's large train file starts its job within the budget (a 1,000,000-row file: its first step within 30 s and
2 GiB of the same job on 1,000 rows; here 100,000 rows against 1,000, the budget scaled to 3 s and 205 MiB), measured
by scripts/bench-job-start in fresh processes; and the checkpoint tokenizer's fast prompt counter
(training/inputs/job_inputs.py `token_counter`) that keeps it so says exactly which prompts are over
`max_prompt_tokens`, the
slow way's counts wherever one is."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "bench-job-start"


def _bench(tmp_path: Path, fmt: str, tokenizer: str) -> dict:
    proc = subprocess.run([sys.executable, str(SCRIPT), "--rows", "1000", "100000", "--formats", fmt, "--tokenizer",
                           tokenizer, "--dir", str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert proc.returncode in (0, 1), proc.stderr[-3000:]
    return json.loads(proc.stdout)


@pytest.mark.timeout(300)
# the slower format and tokenizer only: jsonl with the byte tokenizer added 24 s to CI (`scripts/bench-job-start`
# measures both formats)
@pytest.mark.parametrize(("fmt", "tokenizer"), [("parquet", "bpe-chat")])
def test_a_100x_larger_train_file_starts_within_the_budget_scaled_to_its_size(tmp_path, fmt, tokenizer):
    """Each size's job runs in a fresh process from the config to its first StepRecord. Compared: the wall time less
    the interpreter's start and the imports (the same code whatever the data, and the part that swings most with the
    shared machine's load) and the peak RSS. bpe-chat: a policy checkpoint with its own tokenizer and chat template,
    whose per-prompt count took +7 s at 100,000 rows before the fast counter (+82 s at 1,000,000)."""
    out = _bench(tmp_path, fmt, tokenizer)
    budget, delta = out["budget"], out["delta"][fmt]
    small, large = (out["results"][fmt][k] for k in ("1000", "100000"))
    assert large["train_rows"] == 100_000 and small["train_rows"] == 1000
    assert delta["after_import_s"] <= budget["wall_s"] == 3.0, out
    assert delta["rss_mib"] <= budget["rss_mib"] == 204.8, out
    assert delta["vm_hwm_mib"] <= budget["rss_mib"], out  # the kernel's own high-water mark agrees


# --- the prompt counter of a checkpoint tokenizer -------------------------------------------------------------------


def _script():
    loader = importlib.machinery.SourceFileLoader("bench_job_start", str(SCRIPT))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def policies(tmp_path_factory) -> dict[str, Path]:
    """Two tiny checkpoints whose BPE tokenizers have an NFC normalizer and special tokens: plain and with a chat
    template."""
    script, root = _script(), tmp_path_factory.mktemp("policies")
    return {name: script.write_policy(root / name, chat, 64) for name, chat in (("bpe", False), ("bpe-chat", True))}


def _prompts(n: int, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    alphabet = list("abc déf ghij\n  klmno 12,345 é<|im_end|>Å\u0301")  # non-ASCII, NFC-composable, a special token
    return ["".join(rng.choice(alphabet, size=int(rng.integers(1, 160)))) for _ in range(n)]


def _slow_counts(tok, template: bool, prompts: list) -> np.ndarray:
    from training.inputs.job_inputs import render_prompt

    return np.array([len(tok.encode(render_prompt(p, tok, template))) for p in prompts])


def _tok(path: Path):
    from transformers import AutoTokenizer

    from training.inputs.tokenizer import Tokenizer

    return Tokenizer(AutoTokenizer.from_pretrained(path))


def _spy_fallbacks(monkeypatch) -> list:
    import training.inputs.job_inputs as inputs

    fallbacks = []

    class Spy(inputs._Unchecked):
        def __init__(self, *args):
            fallbacks.append(1)
            super().__init__(*args)

    monkeypatch.setattr(inputs, "_Unchecked", Spy)
    return fallbacks


@pytest.mark.parametrize("name", ["bpe", "bpe-chat"])
def test_the_fast_counter_says_which_prompts_are_over_the_limit_with_their_exact_counts(policies, name, monkeypatch):
    from training.inputs.job_inputs import token_counter

    fallbacks = _spy_fallbacks(monkeypatch)
    tok = _tok(policies[name])
    template = name == "bpe-chat"
    prompts = _prompts(3000)
    column = pa.chunked_array([pa.array(prompts[:1100]), pa.array(prompts[1100:])])  # two chunks, as a reader gives
    slow = _slow_counts(tok, template, prompts)
    assert (slow > 60).any() and (slow <= 60).any()
    for limit in (60, 100, 10**6):
        counts = token_counter(tok, template, limit)(column)
        over = slow > limit
        assert np.array_equal(counts > limit, over), limit
        assert np.array_equal(counts[over], slow[over])  # exact wherever over (the warning names the longest)
        assert (counts >= slow).all() and (counts[~over] <= limit).all()  # elsewhere an upper bound within it
    assert np.array_equal(token_counter(tok, template)(column), slow)  # no limit: every count exact
    assert not fallbacks  # the fast path ran throughout


def test_chat_prompts_under_a_template_are_counted_one_by_one(policies, monkeypatch):
    from training.inputs.job_inputs import token_counter

    fallbacks = _spy_fallbacks(monkeypatch)
    tok = _tok(policies["bpe-chat"])
    prompts = [[{"role": "system", "content": p[:20]}, {"role": "user", "content": p}] for p in _prompts(300)]
    slow = _slow_counts(tok, True, prompts)
    counts = token_counter(tok, True, 80)(pa.chunked_array([pa.array(prompts)]))
    assert np.array_equal(counts > 80, slow > 80) and np.array_equal(counts[slow > 80], slow[slow > 80])
    assert not fallbacks


def test_a_template_that_depends_on_the_prompt_is_found_and_counted_the_slow_way(policies, monkeypatch):
    """The template's prefix and suffix come from two short probes; a template that renders long prompts otherwise
    is caught by the sampled prompts, and the whole column is counted one template call at a time."""
    from training.inputs.job_inputs import token_counter

    fallbacks = _spy_fallbacks(monkeypatch)
    tok = _tok(policies["bpe-chat"])
    tok.hf.chat_template = ("{% for m in messages %}{% if m['content'] | length > 30 %}<|im_start|>long {% endif %}"
                            "{{ m['content'] }}{% endfor %}")
    prompts = [p + "x" * 31 for p in _prompts(600)]
    slow = _slow_counts(tok, True, prompts)
    counts = token_counter(tok, True, 60)(pa.chunked_array([pa.array(prompts)]))
    assert fallbacks
    assert np.array_equal(counts > 60, slow > 60) and np.array_equal(counts[slow > 60], slow[slow > 60])


def test_a_dataset_job_with_a_checkpoint_tokenizer_drops_the_same_prompts_as_the_slow_count(policies, tmp_path):
    """Through the job's own read (training/inputs/job_inputs.py `read_task_files`): the prompts over max_prompt_tokens
    are the ones the tokenizer's own count puts over it, and the warning names the longest with its exact count."""
    from training.inputs.job_inputs import DatasetInputs
    from training.job.config import resolve_config

    prompts = _prompts(400, seed=1)
    tok = _tok(policies["bpe-chat"])
    slow = _slow_counts(tok, True, prompts)
    limit = int(np.sort(slow)[-3])  # two or fewer over it: under the 1% refused, so dropped with a warning
    over = slow > limit
    assert over.any()
    (tmp_path / "train.jsonl").write_text("".join(json.dumps({"question": p, "answer": "#### 1"}) + "\n"
                                                  for p in prompts))
    (tmp_path / "heldout.jsonl").write_text(json.dumps({"question": "held out", "answer": "#### 2"}) + "\n")
    cfg = resolve_config({"policy": {"model_name_or_path": str(policies["bpe-chat"])}, "cache_dir": str(tmp_path),
                          "task": {"kind": "dataset", "train": str(tmp_path / "train.jsonl"),
                                   "heldout": str(tmp_path / "heldout.jsonl"), "prompt_key": "question",
                                   "max_prompt_tokens": limit},
                          "reward": {"kind": "function", "ref": "gsm8k:strict_match"},
                          "gate": {"kind": "function", "ref": "gsm8k:strict_match"}, "eval_prompts": 1})
    said = []
    inputs = DatasetInputs(cfg.task, tok, warn=said.append)
    kept = [p for p, o in zip(prompts, over, strict=True) if not o]
    assert [inputs.prompt("train", i) for i in range(inputs.n_train)] == kept
    assert f"dropped {over.sum()} of 400 prompts" in said[0] and f"the longest is {slow.max()} tokens" in said[0]
