"""The warm-start cache key covers the code that builds the weights, not only the config."""

from pathlib import Path

from training import models
from training.inputs import synthetic_task as task


def test_the_key_changes_with_the_building_code_and_not_otherwise(monkeypatch):
    same = models._hash({"hidden_size": 64}, 0)
    assert models._hash({"hidden_size": 64}, 0) == same
    monkeypatch.setattr(models, "_build_code", lambda: "other code")
    assert models._hash({"hidden_size": 64}, 0) != same


def test_the_code_digest_reads_the_model_and_task_sources(monkeypatch, tmp_path):
    models._build_code.cache_clear()
    before = models._build_code()
    edited = tmp_path / "task.py"
    edited.write_bytes(Path(task.__file__).read_bytes() + b"\n# an edit\n")
    monkeypatch.setattr(task, "__file__", str(edited))
    models._build_code.cache_clear()
    try:
        assert models._build_code() != before
    finally:
        monkeypatch.undo()
        models._build_code.cache_clear()
    assert models._build_code() == before
