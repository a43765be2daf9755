"""No module of the project's packages exceeds 600 lines.

A module past that size has usually grown two jobs; splitting it along its seams keeps each readable on its own
(training/trainer.py was split into trainer, update, checkpoint and evaluation at 706 lines). The packages are the
ones the distribution ships (pyproject.toml's `packages.find.include`); tests and data scripts are not held to it.
"""

from __future__ import annotations

from pathlib import Path

from tests.test_no_import_cycles import ROOT, project_packages

LIMIT = 600

#: modules allowed past the limit, each with the reason; empty: none is today
ALLOWED: dict[str, str] = {}


def line_count(path: Path) -> int:
    with path.open("rb") as f:
        return sum(1 for _ in f)


def oversized(root: Path, packages: list[str], limit: int = LIMIT) -> dict[str, int]:
    """{module path relative to root: lines} for every .py file under the packages with more than `limit` lines."""
    out = {}
    for pkg in packages:
        for path in sorted((root / pkg).rglob("*.py")):
            n = line_count(path)
            if n > limit:
                out[path.relative_to(root).as_posix()] = n
    return out


def test_no_project_module_exceeds_600_lines():
    packages = project_packages()
    assert "training" in packages and "rlhfops" in packages, packages
    found = {p: n for p, n in oversized(ROOT, packages).items() if p not in ALLOWED}
    assert not found, f"modules over {LIMIT} lines (split them along their seams): {found}"


def test_the_count_catches_a_module_one_line_over(tmp_path):
    """The check itself, on hand-made files: 600 lines pass, 601 (no trailing newline on the last) do not."""
    pkg = tmp_path / "pkg" / "sub"
    pkg.mkdir(parents=True)
    (pkg / "ok.py").write_text("x = 1\n" * 600)
    (pkg / "big.py").write_text("x = 1\n" * 600 + "y = 2")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "huge.py").write_text("x = 1\n" * 900)
    assert oversized(tmp_path, ["pkg"]) == {"pkg/sub/big.py": 601}
