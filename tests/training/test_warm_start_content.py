"""The warm-start cache is keyed by content, not by where the rows or the run are: the same rows as JSON lines in one
folder and as Parquet in another, each job started from its own working directory with no `cache_dir` in its config,
build the SFT warm start once (the second job loads it). Different rows build their own. The oracle: a count of the
SFT fits actually run (`training.models.sft_references`, wrapped)."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from training import models

ROWS = [{"question": f"What is {a} + {b}?", "answer": f"{a}+{b} = <<{a}+{b}={a + b}>>{a + b}\n#### {a + b}"}
        for a, b in [(1, 2), (3, 4), (5, 6), (7, 8), (9, 1), (2, 2)]]


def write_job(folder, rows, fmt: str):
    folder.mkdir(parents=True)
    for name in ("train", "heldout"):
        if fmt == "jsonl":
            (folder / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        else:
            pq.write_table(pa.Table.from_pylist(rows), folder / f"{name}.parquet")
    config = {"task": {"kind": "dataset", "train": f"train.{fmt}", "heldout": f"heldout.{fmt}",
                       "prompt_key": "question", "sft_key": "answer", "sft_steps": 2, "sft_batch_size": 2},
              "reward": {"kind": "function", "ref": "gsm8k:flexible_extract"},
              "gate": {"kind": "function", "ref": "gsm8k:strict_match"},
              "policy": {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "intermediate_size": 64},
              "ppo": {"batch_size": 2, "max_new_tokens": 8}, "eval_prompts": 2}
    import yaml

    (folder / "job.yaml").write_text(yaml.safe_dump(config))
    return folder / "job.yaml"


def warm_start(config, cwd, monkeypatch):
    from training.inputs.job_inputs import job_inputs
    from training.inputs.tokenizer import make_tokenizer
    from training.job.config import load_config

    monkeypatch.chdir(cwd)
    cfg = load_config(config)
    tok = make_tokenizer(None, cfg.task, cfg.cache_dir)
    return cfg, models.base_policy(cfg, tok, inputs=job_inputs(cfg, tok, warn=lambda m: None))


@pytest.fixture()
def fits(monkeypatch, tmp_path):
    monkeypatch.setenv("RLHFOPS_CACHE_DIR", str(tmp_path / "user-cache"))
    count = []
    real = models.sft_references

    def counted(*a, **k):
        count.append(1)
        return real(*a, **k)

    monkeypatch.setattr(models, "sft_references", counted)
    return count


def test_the_same_rows_in_two_formats_and_folders_build_one_warm_start(tmp_path, monkeypatch, fits):
    a = write_job(tmp_path / "alice" / "job", ROWS, "jsonl")
    b = write_job(tmp_path / "bob" / "elsewhere", ROWS, "parquet")
    (tmp_path / "cwd1").mkdir()
    (tmp_path / "cwd2").mkdir()
    cfg_a, model_a = warm_start(a, tmp_path / "cwd1", monkeypatch)
    cfg_b, model_b = warm_start(b, tmp_path / "cwd2", monkeypatch)
    assert len(fits) == 1  # built once, loaded the second time
    assert cfg_a.cache_dir == cfg_b.cache_dir == str((tmp_path / "user-cache").resolve())
    assert len(list((tmp_path / "user-cache").glob("base-*.pt"))) == 1
    assert not (tmp_path / "cwd1" / "runs").exists() and not (tmp_path / "cwd2" / "runs").exists()
    for p, q in zip(model_a.parameters(), model_b.parameters(), strict=True):
        assert p.equal(q)


def test_other_rows_build_their_own(tmp_path, monkeypatch, fits):
    a = write_job(tmp_path / "a", ROWS, "jsonl")
    changed = [dict(r) for r in ROWS]
    changed[3]["answer"] = changed[3]["answer"].replace("#### 15", "#### 16")
    b = write_job(tmp_path / "b", changed, "parquet")
    warm_start(a, tmp_path, monkeypatch)
    warm_start(b, tmp_path, monkeypatch)
    assert len(fits) == 2


def test_the_default_cache_is_the_users_not_the_working_directorys(tmp_path, monkeypatch):
    from training.job.config import TrainConfig

    monkeypatch.delenv("RLHFOPS_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.chdir(tmp_path)
    assert TrainConfig().cache_dir == str(tmp_path / "xdg" / "rlhfops" / "warm-starts")
    monkeypatch.setenv("RLHFOPS_CACHE_DIR", "rel/cache")  # made absolute once, against where it was read
    assert TrainConfig().cache_dir == str(tmp_path / "rel" / "cache")
