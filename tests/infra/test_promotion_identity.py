"""A refusal for a different gate or prompt set names the part of the identity that changed (eval/promotion.py
`identity_changes`, infra/promotion.py `identity`): the oracle is hand-made identities that differ in the parts
named; then the real registration path (`tasks.training.register_checkpoint` on a temporary SQLite MLflow store)
with a tenant's gate function edited (refused, naming "gate code") against its neighbour edited (promoted by the
paired test as usual), and the nightly's report reading the decision back from the job's run."""

from __future__ import annotations

import json

import pytest
import yaml

from eval.promotion import Evidence, decide, identity_changes
from infra import tracking as T

SCORES = {str(i): 0.5 for i in range(10)}
PARTS = {"gate.kind": "function", "gate.ref": "my_reward.py:exact_match", "gate.code_hash": "a1b2c3d4e5f60718",
         "heldout.digest": "ffff000011112222", "eval_prompts": "8", "prompt_key": "question",
         "chat_template": "auto", "sampling_seed": "3003000", "decode": "max_new_tokens=16, temperature=1"}


# ------------------------------------------------------------------------------------------ the comparison (oracle)
def test_only_the_gate_code_changed_is_named_with_its_function_and_both_hashes():
    holder = Evidence("P", "G", SCORES, PARTS)
    new = Evidence("P", "G2", SCORES, {**PARTS, "gate.code_hash": "c3d4e5f607182930"})
    d = decide(new, holder, has_holder=True, holder_name="version 1")
    assert not d.promote and d.changed == ("gate code",)
    assert d.reason.startswith("refused: different gate configs (this version G2, version 1 G): ")
    assert "gate code (my_reward.py:exact_match) changed: a1b2c3d4 -> c3d4e5f6" in d.reason
    assert "held-out digest" in d.reason.split("changed:")[1] and d.reason.endswith("unchanged")
    assert d.tags(1)["promotion.changed"] == "gate code" and "\n" not in d.reason


def test_a_new_heldout_file_and_seed_are_named_each():
    holder = Evidence("P", "G", SCORES, PARTS)
    new = Evidence("Q", "G2", SCORES, {**PARTS, "heldout.digest": "9999aaaabbbbcccc", "sampling_seed": "7003000"})
    d = decide(new, holder, has_holder=True)
    assert d.reason.startswith("refused: different prompt sets and gate configs")
    assert d.changed == ("held-out digest", "sampling seed")
    assert "held-out digest changed: ffff0000 -> 9999aaaa" in d.reason
    assert "sampling seed changed: 3003000 -> 7003000" in d.reason and "gate code changed" not in d.reason


def test_identity_changes_compares_part_by_part_and_a_missing_part_reads_none():
    changed, said = identity_changes({"gate.kind": "function", "gate.ref": "f.py:g"}, {"gate.kind": "gold"})
    assert changed == ["gate kind", "gate function"]
    assert said == "gate kind changed: gold -> function; gate function changed: (none) -> f.py:g"
    assert identity_changes(PARTS, dict(PARTS)) == ([], ", ".join(
        ["gate kind", "gate function", "gate code", "held-out digest", "eval prompts", "prompt key", "chat template",
         "sampling seed", "decode settings"]) + " unchanged")


def test_a_holder_registered_without_parts_is_said_so_and_parts_round_trip_through_tags():
    d = decide(Evidence("P", "G2", SCORES, PARTS), Evidence("P", "G", SCORES), has_holder=True,
               holder_name="version 3")
    assert "version 3 was registered without its identity's parts" in d.reason and d.changed == ()
    ev = Evidence("P", "G", SCORES, PARTS)
    assert Evidence.from_tags(ev.tags()) == ev and ev.tags()["identity.gate.code_hash"] == "a1b2c3d4e5f60718"


# ------------------------------------------------------------------------------------------ through the registry
FILE = '''
import re

PATTERN = re.compile(r"#### (-?[0-9]+)")


def _extract(text):
    found = PATTERN.search(text)
    return found.group(1) if found else None


def score(prompts, completions, answer, **kw):
    return [0.5 for _ in completions]


def exact_match(prompts, completions, answer, **kw):
    return [float(_extract(c) == _extract(a)) for c, a in zip(completions, answer)]
'''
NEIGHBOUR_EDIT = ("return [0.5 for", "return [0.9 for")
GATE_EDIT = ("float(_extract(c) == _extract(a))", "float(_extract(c) != _extract(a))")


@pytest.fixture()
def tenant_job(tmp_path):
    rows = "".join(json.dumps({"question": f"{i}+1?", "answer": f"#### {i + 1}"}) + "\n" for i in range(8))
    (tmp_path / "train.jsonl").write_text(rows)
    (tmp_path / "heldout.jsonl").write_text(rows)
    (tmp_path / "fns.py").write_text(FILE)
    (tmp_path / "job.yaml").write_text(
        "task: {kind: dataset, train: train.jsonl, heldout: heldout.jsonl, prompt_key: question}\n"
        "reward: {kind: function, ref: 'fns.py:score'}\ngate: {kind: function, ref: 'fns.py:exact_match'}\n"
        f"eval_prompts: 8\ncache_dir: {tmp_path / 'cache'}\n")
    return tmp_path


def _register(job_dir, name: str, level: float, model: str, parent: str) -> dict:
    """A run directory as the trainer leaves it (its checkpoint's config.yaml, its gate records at that step: 8
    prompts at `level` plus a fixed per-prompt spread), registered by the job flow's own task."""
    from tasks.training import register_checkpoint
    from training.gate import GATE_RECORDS, PromptRecord, record_rows, write_records
    from training.job.config import load_config

    run_dir = job_dir / "runs" / name
    ckpt = run_dir / "checkpoints" / "step-000004"
    ckpt.mkdir(parents=True)
    (ckpt / "config.yaml").write_text(yaml.safe_dump(load_config(job_dir / "job.yaml").model_dump(mode="json")))
    write_records(run_dir / GATE_RECORDS, record_rows(name, 4, [
        PromptRecord(i, 0, level + 0.01 * (i % 3), float("nan"), 3) for i in range(8)]))
    run_id, _ = T.open_run(f"test/{model}/{name}", name, parent_run_id=parent, tags={T.KIND_TAG: "rlhf_job"})
    best = {"checkpoint": str(ckpt), "step": 4, "eval_score": level, "eval_se": 0.01}
    out = register_checkpoint.fn(run_id, model, best, "acme", name, run_state="SUCCEEDED")
    from flows.rlhf_job import promotion_tags

    T.set_tags(run_id, promotion_tags(out))
    T.finish(run_id)
    return out


def test_editing_the_gate_refuses_promotion_naming_gate_code_and_its_neighbour_does_not(store, tenant_job, model):
    from infra.reporting import nightly_report, report_markdown

    night, _ = T.open_run(f"test/{model}/nightly", "nightly", tags={T.KIND_TAG: "nightly"})
    first = _register(tenant_job, "first", 0.2, model, night)
    assert first["alias_best"]
    fns = tenant_job / "fns.py"
    fns.write_text(FILE.replace(*NEIGHBOUR_EDIT))  # the reward beside the gate: the same gate, a paired test
    neighbour = _register(tenant_job, "neighbour", 0.9, model, night)
    assert neighbour["alias_best"] and neighbour["promotion"].startswith("promoted")
    assert neighbour["promotion_changed"] == []
    fns.write_text(FILE.replace(*NEIGHBOUR_EDIT).replace(*GATE_EDIT))  # the gate itself: not comparable
    gate = _register(tenant_job, "gate", 1.5, model, night)
    assert not gate["alias_best"] and gate["promotion_changed"] == ["gate code"]
    assert gate["promotion"].startswith("refused: different gate configs")
    assert "gate code (fns.py:exact_match) changed: " in gate["promotion"]
    assert "held-out digest" in gate["promotion"].split("changed:")[1]
    assert str(T.client().get_model_version_by_alias(model, "best").version) == str(neighbour["version"])
    tags = T.client().get_model_version(model, str(gate["version"])).tags
    held = T.client().get_model_version(model, str(neighbour["version"])).tags
    assert tags["promotion.changed"] == "gate code" and tags["promotion.reason"] == gate["promotion"]
    assert tags["identity.gate.ref"] == "fns.py:exact_match" == held["identity.gate.ref"]
    assert tags["identity.gate.code_hash"] == tags["gate.code_hash"] != held["identity.gate.code_hash"]
    assert tags["identity.heldout.digest"] == held["identity.heldout.digest"]
    # the nightly's report reads the decision back from the job's run
    T.finish(night)
    rep = nightly_report(T.DEFAULT_EXPERIMENT, tonight_id=night)
    refused = rep["promotions"].set_index("job").loc["gate"]
    assert refused.decision == "kept holder" and refused.changed == "gate code"
    md = report_markdown(rep)
    assert "## Registry (tonight's jobs)" in md and "gate code (fns.py:exact_match) changed" in md


def test_the_nightly_summary_says_why_best_did_not_move():
    from rlhfops.commands.nightly import promotion_words

    reason = "refused: different gate configs (...): gate code (fns.py:exact_match) changed: a -> b"
    assert promotion_words({"alias_best": False, "promotion": reason}) == f"; best not moved: {reason}"
    assert promotion_words({"alias_best": True, "promotion": "promoted: ..."}) == " (alias best)"
    assert promotion_words({}) == ""
