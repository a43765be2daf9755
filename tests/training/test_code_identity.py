"""The gate's identity is its own code and what it calls in its file, not its neighbours: a reward function edited
in the file that also holds the gate leaves the gate's `gate.code_hash` (and the promotion gate id built from it) as
it was; editing the gate, a helper it calls or a constant it reads changes it. The oracle is the edit itself: which
definition each edit touched, by hand."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from training.inputs.code_identity import function_identity

FILE = '''
import re

SCALE = 1.0
PATTERN = re.compile(r"#### (-?[0-9]+)")


def _extract(text):
    found = PATTERN.search(text)
    return found.group(1) if found else None


def score(prompts, completions, answer, **kw):
    return [0.5 * SCALE for _ in completions]


def exact_match(prompts, completions, answer, **kw):
    return [float(_extract(c) == _extract(a)) for c, a in zip(completions, answer)]
'''

EDITS = {  # edit -> does it change exact_match's identity?
    "the neighbour's body": (("return [0.5 * SCALE", "return [0.9 * SCALE"), False),
    "the neighbour's signature": (("def score(prompts, completions, answer, **kw)",
                                    "def score(prompts, completions, **kw)"), False),
    "a constant only the neighbour reads": (("SCALE = 1.0", "SCALE = 2.0"), False),
    "a comment and blank lines": (("def exact_match", "# the gate\n\n\ndef exact_match"), False),
    "a new neighbour": (("def score", "def other():\n    return 1\n\n\ndef score"), False),
    "the gate's body": (("float(_extract(c) == _extract(a))", "float(_extract(c) != _extract(a))"), True),
    "the helper it calls": (("return found.group(1) if found", "return found.group(0) if found"), True),
    "the constant its helper reads": (('r"#### (-?[0-9]+)"', 'r"#### (-?[0-9.]+)"'), True),
    "the import its helper's constant uses": (("import re", "import regex as re"), True),
}


@pytest.mark.parametrize("edit", sorted(EDITS))
def test_only_edits_to_the_gate_or_what_it_uses_change_its_identity(edit):
    (old, new), changes = EDITS[edit]
    assert old in FILE
    edited = FILE.replace(old, new, 1)
    assert (function_identity(edited, "exact_match") != function_identity(FILE, "exact_match")) is changes


def test_the_neighbour_edit_does_change_the_neighbours_identity_and_the_file_hash():
    edited = FILE.replace("return [0.5 * SCALE", "return [0.9 * SCALE")
    assert function_identity(edited, "score") != function_identity(FILE, "score")
    import hashlib

    assert hashlib.sha256(edited.encode()).hexdigest() != hashlib.sha256(FILE.encode()).hexdigest()


def test_a_file_that_does_not_parse_or_define_the_name_falls_back_to_its_bytes():
    import hashlib

    broken = FILE + "\ndef (:\n"
    assert function_identity(broken, "exact_match") == hashlib.sha256(broken.encode()).hexdigest()[:16]
    assert function_identity(FILE, "missing") == hashlib.sha256(FILE.encode()).hexdigest()[:16]


def test_the_lineage_tag_and_the_promotion_gate_id_follow_the_gate_not_its_neighbour(tmp_path):
    """Through the job's lineage (the registry's `gate.code_hash` tag) and `infra.promotion.gate_identity`'s gate id:
    the reward edited in the gate's file keeps both; the gate edited changes both."""
    import json

    from infra.promotion import gate_identity
    from training.inputs.job_inputs import job_lineage
    from training.job.config import load_config

    rows = "".join(json.dumps({"question": f"{i}+1?", "answer": f"#### {i + 1}"}) + "\n" for i in range(4))
    (tmp_path / "train.jsonl").write_text(rows)
    (tmp_path / "heldout.jsonl").write_text(rows)
    (tmp_path / "job.yaml").write_text(
        "task: {kind: dataset, train: train.jsonl, heldout: heldout.jsonl, prompt_key: question}\n"
        "reward: {kind: function, ref: 'fns.py:score'}\ngate: {kind: function, ref: 'fns.py:exact_match'}\n"
        "eval_prompts: 4\n" f"cache_dir: {tmp_path / 'cache'}\n")

    def ids(source):
        (tmp_path / "fns.py").write_text(source)
        cfg = load_config(tmp_path / "job.yaml")
        tags = job_lineage(cfg)["tags"]
        return tags["gate.code_hash"], tags["reward.code_hash"], gate_identity(cfg)[1]

    gate0, reward0, id0 = ids(FILE)
    gate1, reward1, id1 = ids(FILE.replace("return [0.5 * SCALE", "return [0.9 * SCALE"))
    assert (gate1, id1) == (gate0, id0) and reward1 != reward0
    gate2, _, id2 = ids(FILE.replace("float(_extract(c) == _extract(a))", "float(_extract(c) != _extract(a))"))
    assert gate2 != gate0 and id2 != id0


def test_a_builtin_gate_keeps_its_identity_when_its_neighbour_reward_changes(tmp_path, monkeypatch):
    from training.inputs import rewards
    from training.inputs.rewards import gsm8k

    source = open(gsm8k.__file__).read()
    before = rewards.code_hash("gsm8k:strict_match"), rewards.code_hash("gsm8k:flexible_extract")
    assert "def flexible_extract" in source
    copy = tmp_path / "gsm8k.py"
    copy.write_text(source.replace("def flexible_extract(", "def flexible_extract(  # edited\n        ", 1)
                    .replace("FLEXIBLE_PATTERN = re.compile(", "FLEXIBLE_PATTERN = re.compile(  # x\n    ", 1)
                    + "\n\ndef another_neighbour():\n    return 2\n")
    monkeypatch.setattr(gsm8k, "__file__", str(copy))
    # formatting only: neither moves; then a real edit of the reward's pattern moves the reward only
    assert (rewards.code_hash("gsm8k:strict_match"), rewards.code_hash("gsm8k:flexible_extract")) == before
    copy.write_text(source.replace(r'FLEXIBLE_PATTERN = re.compile(r"(-?[$0-9.,]{2,})|(-?[0-9]+)")',
                                   r'FLEXIBLE_PATTERN = re.compile(r"(-?[0-9.,]{2,})|(-?[0-9]+)")', 1))
    assert rewards.code_hash("gsm8k:strict_match") == before[0]
    assert rewards.code_hash("gsm8k:flexible_extract") != before[1]


def test_a_module_ref_is_identified_by_its_function_too(tmp_path):
    from training.inputs.code_identity import ref_identity

    (tmp_path / "pkgx").mkdir()
    (tmp_path / "pkgx" / "__init__.py").write_text("")
    (tmp_path / "pkgx" / "fns.py").write_text(FILE)
    ref = SimpleNamespace(file=None, module="pkgx.fns", name="exact_match", code_hash="whole-file")
    assert ref_identity(ref, tmp_path) == function_identity(FILE, "exact_match")
