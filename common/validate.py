"""Input checks shared by the CLI, the flows and the config loaders: each raises `BadInput` with one line
that names the field (a config field or a flow parameter, never a CLI flag) and the fix, before any work.

- `check_out_dir` / `check_out_file`: an output path that can be created where it is asked for (a directory
  is not an existing file and vice versa; no existing file in the way of a parent; the nearest existing
  parent is writable). Checked before any work, so a wrong `out` fails in milliseconds, not after the run.
- `check_workers`: worker process counts.
- `memory_limit_bytes` / `check_memory`: estimated memory of a run against a limit, so a config that would
  allocate 100 GB fails with the estimate instead of a MemoryError or the OOM killer. The limit is
  `RLHFOPS_MEMORY_LIMIT_GIB` when set, else 80% of this machine's physical memory.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

from common.errors import BadInput

#: environment variable that raises (or lowers) the memory bound of `check_memory`
MEMORY_LIMIT_ENV = "RLHFOPS_MEMORY_LIMIT_GIB"
#: share of physical memory a single run may plan to use when the variable is not set
DEFAULT_MEMORY_SHARE = 0.8
GIB = 1024**3


def _nearest_existing(path: Path) -> Path:
    p = path
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def _check_parents(path: Path, field: str) -> None:
    base = _nearest_existing(path.parent if path.parent != Path("") else Path("."))
    if not base.is_dir():
        raise BadInput(f"{field}: '{path}' cannot be created: '{base}' is an existing file, not a directory "
                       "(choose another path or move the file)")
    if not os.access(base, os.W_OK | os.X_OK):
        raise BadInput(f"{field}: '{path}' cannot be created: no write permission in '{base}' "
                       "(choose a writable location)")
    _probe(base, path, field)


def _probe(base: Path, path: Path, field: str) -> None:
    """Create and remove an empty directory in `base`: `os.access` says yes to root everywhere, also on a
    filesystem nothing can be created on (/proc, /sys, a read-only mount)."""
    import tempfile

    try:
        os.rmdir(tempfile.mkdtemp(prefix=".rlhfops-probe-", dir=base))
    except OSError as err:
        what = f"nothing can be written in '{base}'" if base == path else f"'{path}' cannot be created in '{base}'"
        raise BadInput(f"{field}: {what} ({err.strerror}; choose a writable location)") from None


def check_out_dir(path: str | Path | None, field: str = "out") -> None:
    """`path` can be used as an output directory (created later, by the work)."""
    if path is None:
        return
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise BadInput(f"{field}: '{path}' is an existing file but a directory is expected "
                       "(pass a directory path or move the file)")
    if path.is_dir():
        if not os.access(path, os.W_OK | os.X_OK):
            raise BadInput(f"{field}: no write permission in '{path}' (choose a writable directory)")
        _probe(path, path, field)
        return
    _check_parents(path, field)


def check_out_file(path: str | Path | None, field: str = "out") -> None:
    """`path` can be written as a file (its parent directories are created later, by the work)."""
    if path is None:
        return
    path = Path(path)
    if path.is_dir():
        raise BadInput(f"{field}: '{path}' is a directory but a file is expected (pass a file path, "
                       f"e.g. {path / 'out'}{path.suffix or ''})")
    if path.exists():
        if not os.access(path, os.W_OK):
            raise BadInput(f"{field}: '{path}' exists and is not writable (choose another file)")
        return
    _check_parents(path, field)


def max_workers() -> int:
    """More worker processes than 4x the cores only adds start-up time and memory (each is a Python process)."""
    return 4 * (os.cpu_count() or 1)


def check_workers(workers: int | None, field: str = "workers") -> None:
    """None means "all cores"; otherwise 1 <= workers <= 4x the cores."""
    if workers is None:
        return
    if isinstance(workers, bool) or not isinstance(workers, int):
        raise BadInput(f"{field}: {workers!r} is not a whole number (give 1 or more, or leave it unset for all cores)")
    if workers < 1:
        raise BadInput(f"{field}: {workers} must be >= 1 (leave it unset to use all {os.cpu_count()} cores)")
    if workers > max_workers():
        raise BadInput(f"{field}: {workers} is more than 4x this machine's {os.cpu_count()} cores "
                       f"(use at most {max_workers()})")


def check_seed(seed: int, field: str = "seed") -> None:
    """Seeds feed numpy's and torch's generators: 0 <= seed < 2**32."""
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**32:
        raise BadInput(f"{field}: {seed!r} must be a whole number in [0, 2**32 - 1]")


def check_finite_tree(tree: Any, source: str, path: str = "", max_abs: float = math.inf) -> None:
    """No NaN or infinity anywhere in a parsed YAML/JSON tree (YAML spells them .nan, .inf), and no number
    beyond `max_abs` in magnitude."""
    if isinstance(tree, dict):
        for k, v in tree.items():
            check_finite_tree(v, source, f"{path}.{k}" if path else str(k), max_abs)
    elif isinstance(tree, list | tuple):
        for i, v in enumerate(tree):
            check_finite_tree(v, source, f"{path}[{i}]", max_abs)
    elif isinstance(tree, str) and _looks_numeric(tree):
        # YAML 1.1 reads 1e308 (no dot) as a string; pydantic then turns it into a float
        check_finite_tree(float(tree), source, path, max_abs)
    elif isinstance(tree, int | float) and not isinstance(tree, bool):
        if not math.isfinite(tree):
            raise BadInput(f"{source}: field '{path}': {tree} is not a finite number (give a finite value)")
        if abs(tree) > max_abs:
            raise BadInput(f"{source}: field '{path}': {tree:g} is beyond +-{max_abs:g} (a typo in the exponent? "
                           "give a value in range)")


def _looks_numeric(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return any(ch.isdigit() for ch in text)


def memory_limit_bytes() -> float:
    """`RLHFOPS_MEMORY_LIMIT_GIB` if set, else 80% of physical memory."""
    env = os.environ.get(MEMORY_LIMIT_ENV)
    if env:
        try:
            gib = float(env)
        except ValueError:
            gib = math.nan
        if not math.isfinite(gib) or gib <= 0:
            raise BadInput(f"{MEMORY_LIMIT_ENV}: '{env}' must be a positive number of GiB")
        return gib * GIB
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # not POSIX: assume 16 GiB
        total = 16 * GIB
    return DEFAULT_MEMORY_SHARE * total


def memory_limit_text() -> str:
    if os.environ.get(MEMORY_LIMIT_ENV):
        return f"{MEMORY_LIMIT_ENV}={os.environ[MEMORY_LIMIT_ENV]}"
    return f"80% of this machine's memory; set {MEMORY_LIMIT_ENV} to raise it"


def check_memory(estimate_bytes: float, field: str, what: str, fix: str) -> None:
    """Raise BadInput when `estimate_bytes` exceeds the memory limit. `what`: what was estimated (with the
    numbers behind it); `fix`: which field to lower."""
    limit = memory_limit_bytes()
    if estimate_bytes > limit:
        raise BadInput(f"{field}: {what} needs ~{estimate_bytes / GIB:,.1f} GiB, over the {limit / GIB:,.1f} GiB "
                       f"limit ({memory_limit_text()}); {fix}")


def set_dotted(tree: dict, dotted: str, value: Any) -> None:
    """`tree[a][b][c] = value` for `dotted` = "a.b.c"; a missing section is created (validation then names an
    unknown key), a value in the way is an error naming the override."""
    import copy

    parts = dotted.split(".")
    if not all(p.strip() for p in parts):
        raise BadInput(f"override '{dotted}': empty part in the dotted key (e.g. ppo.kl_coef)")
    node = tree
    for i, part in enumerate(parts[:-1]):
        nxt = node.get(part)
        if nxt is None:
            nxt = node[part] = {}
        elif not isinstance(nxt, dict):
            raise BadInput(f"override '{dotted}': '{'.'.join(parts[: i + 1])}' is a value, not a section")
        node = nxt
    node[parts[-1]] = copy.deepcopy(value)
