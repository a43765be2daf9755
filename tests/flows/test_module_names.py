"""No module Prefect puts on sys.path may shadow the standard library or an installed package.

A Prefect worker that loads the entrypoint `flows/<name>.py:<flow>` puts `flows/` first on `sys.path`
(and the working directory, the repository root, too). A file there named like a standard-library
module (`flows/platform.py` vs `platform`) replaces that module in the worker process and in every
process it spawns, and they die at import.
"""

from __future__ import annotations

import sys
from importlib.metadata import packages_distributions
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OWN_DISTRIBUTION = "rlhfops"


def _names_on_worker_path() -> dict[str, Path]:
    names: dict[str, Path] = {}
    for folder in (ROOT / "flows", ROOT / "tasks"):
        for path in folder.iterdir():
            if path.suffix == ".py" and path.stem != "__init__":
                names[path.stem] = path
            elif path.is_dir() and (path / "__init__.py").exists():
                names[path.name] = path
    for path in ROOT.iterdir():
        if path.is_dir() and (path / "__init__.py").exists():
            names[path.name] = path
    return names


def test_no_module_on_the_worker_path_shadows_stdlib_or_installed_packages():
    installed = {
        name for name, dists in packages_distributions().items()
        if any(d.lower() != OWN_DISTRIBUTION for d in dists)
    }
    clashes = {
        name: str(path.relative_to(ROOT))
        for name, path in _names_on_worker_path().items()
        if name in sys.stdlib_module_names or name in installed
    }
    assert not clashes, f"rename these modules, they shadow importable modules under a Prefect worker: {clashes}"


def test_the_check_sees_a_stdlib_clash():
    # The check itself must be able to fail: `platform` is what once broke every spawned worker.
    assert "platform" in sys.stdlib_module_names
    assert "platform_round" in _names_on_worker_path()
