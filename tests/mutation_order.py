"""A pytest plugin for the mutation runs only (`[tool.mutmut] pytest_add_cli_args`: `-p tests.mutation_order`): run a
mutant's tests fastest first, by the times mutmut measured (`mutants/mutmut-stats.json`).

mutmut runs each mutant's covering tests with `-x` in the order of a Python set (random per process), so a mutant
that the ledger's bill test kills in 0.1 s could first sit through the sweep oracles (seconds each). Whole test
modules are ordered by their summed time (module-scoped fixtures are set up once), then the tests inside each. A run
without the stats file (the stats run itself, or plain pytest) keeps pytest's order."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import pytest


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    try:
        took = json.loads((Path(config.rootpath) / "mutmut-stats.json").read_text())["duration_by_test"]
    except (OSError, ValueError, KeyError):
        return
    module_s: dict[str, float] = defaultdict(float)
    for item in items:
        module_s[item.nodeid.split("::", 1)[0]] += took.get(item.nodeid, 0.0)
    items.sort(key=lambda item: (module_s[item.nodeid.split("::", 1)[0]], item.nodeid.split("::", 1)[0],
                                 took.get(item.nodeid, 0.0)))
