"""Built-in reward functions, by name: one small module per data source, one registry (after verl's
verl/utils/reward_score/).

A job's `reward.ref` / `gate.ref` names either a built-in here (`gsm8k:strict_match`) or the tenant's own code
(FILE.py:NAME, package.module:NAME). Built-ins are platform code: training/inputs/scorers.py calls them in the trainer's
process, with no worker pool; `builtin(name)` is None for any other name, so the caller falls back to tenant code.
`code_hash(name)` fingerprints a built-in's source file for lineage, as tenant code is fingerprinted.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

from training.inputs.rewards import gsm8k

#: "<data source>:<score>" -> fn(prompts, completions, **columns) -> list[float | None]
REGISTRY: dict[str, Callable] = {
    "gsm8k:strict_match": gsm8k.strict_match,
    "gsm8k:flexible_extract": gsm8k.flexible_extract,
}


def builtin(name: str) -> Callable | None:
    """The built-in reward called `name`, or None when no built-in has that name."""
    return REGISTRY.get(name)


def names() -> list[str]:
    """The registered built-in names, sorted."""
    return sorted(REGISTRY)


def code_hash(name: str) -> str:
    """The identity of built-in `name` (KeyError for an unknown name): its function's own code and the definitions it
    uses in its module (`training.inputs.code_identity`), so editing a neighbour (gsm8k's reward beside its gate)
    leaves it as it was."""
    from training.inputs.code_identity import file_function_identity

    fn = REGISTRY[name]
    return file_function_identity(Path(sys.modules[fn.__module__].__file__), fn.__name__)
