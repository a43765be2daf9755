"""Lineage for analysts: a dataset job's train and held-out files become MLflow dataset inputs (name, the file's own
sha256 as digest, source, rows, context), read back from the store; the reward and gate code hashes are tags; a
version scored by another gate, or on another held-out file, is never compared with the holder."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from training.job.config import resolve_config

REPO = Path(__file__).resolve().parents[2]
ARITH = REPO / "configs" / "ppo-arith.yaml"


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_dataset_inputs_and_code_hashes_read_back_from_mlflow(mlflow_store, tmp_path):
    from mlflow.tracking import MlflowClient

    from flows.rlhf_job import log_lineage
    from infra import tracking as T

    cfg = resolve_config(ARITH)
    run_id, _ = T.open_run("test/lineage", "lineage")
    log_lineage(run_id, cfg)
    run = MlflowClient().get_run(run_id)
    got = {d.dataset.name: d for d in run.inputs.dataset_inputs}
    train, held = REPO / "data" / "arith" / "train.jsonl", REPO / "data" / "arith" / "heldout.jsonl"
    assert set(got) == {"train.jsonl", "heldout.jsonl"}
    for path, context, rows in ((train, "training", 4000), (held, "eval", 500)):
        d = got[path.name]
        assert _sha(path).startswith(d.dataset.digest)  # the file's own hash (MLflow keeps 36 characters)
        assert json.loads(d.dataset.source)["uri"] == str(path.resolve())
        assert json.loads(d.dataset.profile)["num_rows"] == rows
        assert {t.key: t.value for t in d.tags}["mlflow.data.context"] == context
    tags = run.data.tags
    assert tags["task.kind"] == "dataset" and tags["reward.ref"] == "gsm8k:flexible_extract"
    from training.inputs.code_identity import file_function_identity

    gsm8k = REPO / "training" / "inputs" / "rewards" / "gsm8k.py"  # each function's own code, not the whole file
    assert tags["reward.code_hash"] == file_function_identity(gsm8k, "flexible_extract")
    assert tags["gate.code_hash"] == file_function_identity(gsm8k, "strict_match") != tags["reward.code_hash"]
    assert tags["heldout.digest"] == _sha(held)
    T.finish(run_id)


def test_versions_scored_by_different_gates_or_held_out_files_are_not_compared(tmp_path):
    from infra.promotion import gate_identity

    strict = resolve_config(ARITH)
    flexible = resolve_config(ARITH, {"gate.ref": "gsm8k:flexible_extract"})
    other = tmp_path / "heldout.jsonl"
    extra = b'{"question": "q?", "answer": "#### 1"}\n'
    other.write_bytes((REPO / "data" / "arith" / "heldout.jsonl").read_bytes() + extra)
    moved = resolve_config(ARITH, {"task.heldout": str(other)})
    (p_strict, g_strict), (p_flex, g_flex), (p_moved, _) = map(gate_identity, (strict, flexible, moved))
    assert p_strict == p_flex and g_strict != g_flex  # same prompts, another gate: refused as "different gate"
    assert p_moved != p_strict  # another held-out file: refused as "different prompt sets"
    assert gate_identity(resolve_config(ARITH)) == (p_strict, g_strict)  # the same job: comparable


def test_the_algorithm_reads_back_from_mlflow_as_a_tag_and_params(mlflow_store):
    """A job run's algorithm is a tag (`log_lineage`, every job run) and params (`algorithm_params`, as a platform
    job and a sweep trial log them; `rlhf_job` logs the whole resolved config, the same keys), read back from the
    store and found by a search filtered on them."""
    from mlflow.tracking import MlflowClient

    from flows.rlhf_job import log_lineage
    from infra import tracking as T
    from training.inputs.job_inputs import algorithm_params

    ids = {}
    for algorithm, over in (("ppo", {}), ("grpo", {"algorithm": "grpo", "ppo.group_size": 4})):
        cfg = resolve_config(REPO / "configs" / "ppo-tiny.yaml", over)
        run_id, _ = T.open_run(f"test/algorithm/{algorithm}", algorithm)
        log_lineage(run_id, cfg)
        T.log_params(run_id, algorithm_params(cfg))
        T.finish(run_id)
        ids[algorithm] = run_id
    run = MlflowClient().get_run(ids["grpo"])
    assert run.data.tags["algorithm"] == "grpo"
    assert {k: run.data.params[k] for k in ("algorithm", "ppo.group_size", "ppo.scale_rewards", "ppo.kl_in")} == {
        "algorithm": "grpo", "ppo.group_size": "4", "ppo.scale_rewards": "group", "ppo.kl_in": "loss"}
    assert MlflowClient().get_run(ids["ppo"]).data.params["ppo.group_size"] == "1"
    exp = T.experiment_id()
    for where in ("tags.algorithm = 'grpo'", "params.algorithm = 'grpo'", "params.`ppo.group_size` = '4'"):
        assert [r.info.run_id for r in MlflowClient().search_runs([exp], where)] == [ids["grpo"]], where
