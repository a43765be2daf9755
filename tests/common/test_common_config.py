"""The one config loader, the one flatten, and the shipped-configs lookup (`common/config.py`)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from pydantic import BaseModel, ConfigDict, Field

from common.config import config_dir, config_path, flatten, load_config, parse_overrides
from common.errors import BadInput

REPO = Path(__file__).resolve().parents[2]


class Inner(BaseModel):
    model_config = ConfigDict(extra="forbid")
    lr: float = Field(1e-3, gt=0)
    sizes: list[int] = [1, 2]


class Outer(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    steps: int = 10
    inner: Inner = Inner()


def test_flatten_against_hand_written_keys():
    tree = {"a": 1, "b": {"c": 2, "d": {"e": [3, 4], "f": None}}, "g": {}, "h": "x"}
    # written out by hand: lists and None are leaves, an empty section holds no value
    assert flatten(tree) == {"a": 1, "b.c": 2, "b.d.e": [3, 4], "b.d.f": None, "h": "x"}
    assert flatten({"x": {"y": 1}}, "p.") == {"p.x.y": 1}


def test_load_config_applies_overrides_and_defaults(tmp_path):
    f = tmp_path / "job.yaml"
    f.write_text("steps: 3\ninner: {lr: 0.5}\n")
    cfg = load_config(Outer, f, {"inner.sizes": [7], "steps": 4}, defaults={"name": "job"})
    assert (cfg.name, cfg.steps, cfg.inner.lr, cfg.inner.sizes) == ("job", 4, 0.5, [7])
    # a default never beats the file
    f.write_text("name: given\n")
    assert load_config(Outer, f, defaults={"name": "job"}).name == "given"
    # a mapping is not mutated by the overrides
    raw = {"name": "m", "inner": {"lr": 0.1}}
    assert load_config(Outer, raw, {"inner.lr": 0.2}).inner.lr == 0.2
    assert raw == {"name": "m", "inner": {"lr": 0.1}}
    # a check sees the raw tree and the source before validation
    seen = []
    load_config(Outer, f, check=lambda tree, source: seen.append((tree, source)))
    assert seen == [({"name": "given"}, str(f))]


def test_load_config_errors_name_the_file_or_the_override_and_the_field(tmp_path):
    f = tmp_path / "job.yaml"
    f.write_text("name: j\ninner: {lrr: 0.5}\n")
    with pytest.raises(BadInput) as err:
        load_config(Outer, f, field="config")
    assert str(err.value).startswith(f"{f}: field 'inner.lrr': unknown key")
    f.write_text("name: j\n")
    with pytest.raises(BadInput) as err:
        load_config(Outer, f, {"inner.lr": -1})
    assert str(err.value).startswith("override 'inner.lr=-1': field 'inner.lr': -1 is out of range")
    with pytest.raises(BadInput, match=r"^experiment: file '.*nope.yaml' not found"):
        load_config(Outer, tmp_path / "nope.yaml", field="experiment")
    assert "\n" not in str(err.value)


def test_parse_overrides():
    assert parse_overrides(["a.b=0.5", "c=[1, 2]", " d =text"]) == {"a.b": 0.5, "c": [1, 2], "d": "text"}
    with pytest.raises(BadInput, match="override 'nokey': expected key=value"):
        parse_overrides(["nokey"])
    with pytest.raises(BadInput, match=r"override 'x=\[1,': the value is not valid YAML"):
        parse_overrides(["x=[1,"])


def test_configs_paths_resolve_from_any_directory(tmp_path, monkeypatch):
    """`configs/<name>` names the shipped file when the working directory has no such file; a file the user
    has there wins; other missing paths stay as given (and are reported missing by the loader)."""
    assert (config_dir() / "E1.yaml").read_bytes() == (REPO / "configs" / "E1.yaml").read_bytes()
    monkeypatch.chdir(tmp_path)
    assert config_path("configs/E1.yaml").read_bytes() == (REPO / "configs" / "E1.yaml").read_bytes()
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "E1.yaml").write_text("name: mine\n")
    assert config_path("configs/E1.yaml") == Path("configs/E1.yaml")
    assert config_path("configs/none.yaml") == Path("configs/none.yaml")
    assert config_path("other/E1.yaml") == Path("other/E1.yaml")


def test_every_loader_goes_through_common_config():
    """One loader: no module outside common/ reads a YAML config or applies dotted overrides itself."""
    own = {"read_yaml_mapping", "validate_with_overrides"}
    offenders = []
    for path in sorted(REPO.glob("*/**/*.py")):
        rel = path.relative_to(REPO).as_posix()
        if rel.split("/")[0] in {"common", "tests", ".venv", "data", "docs", "mutants"}:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "common.validate":
                offenders += [f"{rel}: {a.name}" for a in node.names if a.name in own]
            if isinstance(node, ast.FunctionDef) and node.name in {"_flatten", "flatten", "_set", "parse_overrides"}:
                offenders.append(f"{rel}: defines {node.name}")
    assert offenders == []
