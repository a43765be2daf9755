"""The check of a request needs no model stack: reading and checking a job's data files and function refs imports
neither torch nor transformers (training/inputs/__init__.py), so a bad data file is refused as fast as a bad config.

The byte tokenizer's counts come from `ByteCounts` there, held here to the real `ByT5Tokenizer(extra_ids=0)`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

CHECK = """
import json, sys
from common.errors import BadInput
from training.job.request import parse_request
try:
    parse_request({"config": sys.argv[1], "out_root": sys.argv[2]}).checked()
    error = None
except BadInput as err:
    error = str(err)
print(json.dumps({"error": error, "loaded": sorted(m for m in ("torch", "transformers") if m in sys.modules)}))
"""


def _dataset_job(tmp_path: Path, train_rows: list[dict], gate_ref: str = "gsm8k:strict_match") -> Path:
    rows = [{"question": f"What is {i} + 1?", "answer": f"{i} + 1 = {i + 1}\n#### {i + 1}"} for i in range(40)]
    (tmp_path / "heldout.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in train_rows))
    config = tmp_path / "job.yaml"
    config.write_text(
        "steps: 2\neval_prompts: 8\npolicy: {arch: llama, hidden_size: 32, num_layers: 1, num_heads: 2, "
        "intermediate_size: 64}\ntask: {kind: dataset, train: train.jsonl, heldout: heldout.jsonl, "
        "prompt_key: question, sft_key: answer}\nreward: {kind: function, ref: 'rules.py:score'}\n"
        f"gate: {{kind: function, ref: '{gate_ref}'}}\n")
    (tmp_path / "rules.py").write_text("def score(completions, **kwargs):\n    return [0.0 for _ in completions]\n")
    return config


def _check(config: Path, out_root: Path) -> dict:
    proc = subprocess.run([sys.executable, "-c", CHECK, str(config), str(out_root)], capture_output=True, text=True,
                          cwd=REPO, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_a_bad_data_file_is_refused_without_torch_or_transformers(tmp_path):
    good = [{"question": "What is 1 + 1?", "answer": "#### 2"}] * 5
    config = _dataset_job(tmp_path, good + [{"question": 7, "answer": "#### 7"}])
    got = _check(config, tmp_path / "out")
    assert got["error"] is not None and "task.train" in got["error"] and "line 6" in got["error"], got
    assert got["loaded"] == [], f"the check of a request loaded {got['loaded']}"


def test_a_good_dataset_job_is_checked_without_torch_or_transformers(tmp_path):
    config = _dataset_job(tmp_path, [{"question": f"What is {i} + 2?", "answer": f"#### {i + 2}"} for i in range(30)])
    got = _check(config, tmp_path / "out")
    assert got == {"error": None, "loaded": []}


def test_a_prompt_over_max_prompt_tokens_is_counted_in_bytes_as_the_byte_tokenizer_counts(tmp_path):
    """A prompt of 300 two-byte characters is 600 tokens of the byte tokenizer: over a limit of 512 although its
    300 characters are not (a count by characters would pass it)."""
    long = "é" * 300
    config = _dataset_job(tmp_path, [{"question": long, "answer": "#### 1"}]
                          + [{"question": "1 + 1?", "answer": "#### 2"}])
    text = config.read_text().replace("sft_key: answer}", "sft_key: answer, max_prompt_tokens: 512}")
    config.write_text(text)
    got = _check(config, tmp_path / "out")
    assert got["loaded"] == []
    assert got["error"] is None or "line 1" in got["error"], got


def test_byte_counts_is_the_byte_tokenizer_as_the_reader_sees_it():
    """Oracle: transformers' own ByT5Tokenizer(extra_ids=0), the tokenizer a job with no checkpoint trains with."""
    from transformers import ByT5Tokenizer

    from training.inputs.job_inputs import DATASET_SEPARATOR, token_counter
    from training.inputs.tokenizer import ByteCounts, Tokenizer

    real = Tokenizer(ByT5Tokenizer(extra_ids=0))
    light = ByteCounts()
    assert real.byte_level and light.byte_level
    assert len(light.hf) == len(real.hf) and light.hf.name_or_path == real.hf.name_or_path
    assert light.hf.chat_template == getattr(real.hf, "chat_template", None)
    import pyarrow as pa

    prompts = ["What is 2 + 2?", "héllo wörld", "日本語のテキスト", "", "tabs\tand\nnewlines"]
    column = pa.chunked_array([pa.array(prompts)])
    want = [len(real.encode(p + DATASET_SEPARATOR)) for p in prompts]
    assert list(token_counter(light, template=False)(column)) == want


@pytest.mark.parametrize("bad", ["missing.py:score", "rules.py:nope"])
def test_a_bad_function_ref_is_refused_without_torch(tmp_path, bad):
    config = _dataset_job(tmp_path, [{"question": "1 + 1?", "answer": "#### 2"}] * 3, gate_ref=bad)
    got = _check(config, tmp_path / "out")
    assert got["error"] is not None and "gate.ref" in got["error"], got
    assert got["loaded"] == []
