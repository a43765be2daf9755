"""The CLI's command modules parse, call and print: the work they start lives beside what it measures or runs
(the domain packages, `tasks/`, `infra/`). A module that grows past its limit has taken in logic that belongs there.
Limits: 300 lines for a command module, 150 for a benchmark command (`bench_*.py`)."""

from __future__ import annotations

from pathlib import Path

COMMANDS = Path(__file__).resolve().parents[2] / "rlhfops" / "commands"
COMMAND_LIMIT = 300
BENCH_LIMIT = 150
#: modules over their limit for now, each with why; remove the entry when the module is split
ALLOWED_OVER: dict[str, str] = {}


def limit(path: Path) -> int:
    return BENCH_LIMIT if path.name.startswith("bench_") else COMMAND_LIMIT


def over_limit(folder: Path) -> dict[str, int]:
    """name -> line count of each module of `folder` longer than its limit."""
    sizes = {p.name: len(p.read_text().splitlines()) for p in sorted(folder.glob("*.py"))}
    return {name: n for name, n in sizes.items() if n > limit(folder / name)}


def test_the_check_finds_a_long_command_and_a_long_benchmark(tmp_path):
    (tmp_path / "short.py").write_text("x = 1\n" * COMMAND_LIMIT)
    (tmp_path / "long.py").write_text("x = 1\n" * (COMMAND_LIMIT + 1))
    (tmp_path / "bench_short.py").write_text("x = 1\n" * BENCH_LIMIT)
    (tmp_path / "bench_long.py").write_text("x = 1\n" * (BENCH_LIMIT + 1))
    assert over_limit(tmp_path) == {"long.py": COMMAND_LIMIT + 1, "bench_long.py": BENCH_LIMIT + 1}


def test_no_command_module_is_over_its_limit():
    over = {name: n for name, n in over_limit(COMMANDS).items() if name not in ALLOWED_OVER}
    assert not over, f"command modules over their limit (300 lines, 150 for bench_*.py): {over}"


def test_every_allowed_module_still_exists_and_is_still_over():
    # an entry that no longer applies is removed, so the allow-list never hides a module that grows back
    stale = [name for name in ALLOWED_OVER if name not in over_limit(COMMANDS)]
    assert not stale, f"remove from ALLOWED_OVER, now within the limit or gone: {stale}"
