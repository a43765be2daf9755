"""The detector and alert registry (eval/registry.py) means the same whatever was imported first.

The alerts used to add themselves to the detector registry when `eval.health` was imported: `make_detector`
knew 7 or 15 names by import order and the generated detector docs listed the alerts or not. Each case below
starts a clean interpreter, imports one entry point first, then asks every question that used to depend on
it. The oracle for what the registry must hold is independent of it: every detector class defined anywhere
in eval/ (found by walking the package), split into early-stop detectors and run-health alerts.
"""

from __future__ import annotations

import importlib
import json
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: what a process may have imported before it asks the registry (the old side-effect path included)
FIRST_IMPORTS = {
    "detectors": "import eval.detectors",
    "registry": "import eval.registry",
    "health-catalog": "import eval.health; eval.health.Catalog.from_file()",
    "docs-generator": "import studies.detector_report",
}

PROBE = """
import json, sys
{first}
import pandas as pd
import eval.detectors as detectors
from eval.detectors import make_detector
names = json.loads(sys.argv[1])
built = {{}}
for name in names:  # before anything else imports the registry or the health package
    try:
        built[name] = type(make_detector(name)).__name__
    except ValueError:
        built[name] = None
from eval import registry
from studies.detector_report import render
empty = pd.DataFrame(columns=["experiment", "variant", "scheduler"])
print(json.dumps({{
    "built": built,
    "early_stop": list(registry.EARLY_STOP_DETECTORS), "alerts": list(registry.ALERTS),
    "all": list(registry.DETECTORS),
    "docs": render(empty),
}}))
"""


def defined_detector_classes() -> tuple[dict[str, str], dict[str, str]]:
    """(early-stop detectors, alerts) as name -> class name: every class in eval/ that subclasses the detector
    interface and sets its own `name`, found by importing every module of the package."""
    import eval
    from eval.detector_base import Detector
    from eval.health.base import HealthAlert

    for mod in pkgutil.walk_packages(eval.__path__, "eval."):
        importlib.import_module(mod.name)
    seen, todo = [], [Detector]
    while todo:
        for sub in todo.pop().__subclasses__():
            seen.append(sub)
            todo.append(sub)
    named = [c for c in seen if c.__module__.startswith("eval.") and "name" in vars(c)]
    early = {c.name: c.__name__ for c in named if not issubclass(c, HealthAlert)}
    alerts = {c.name: c.__name__ for c in named if issubclass(c, HealthAlert)}
    return early, alerts


@pytest.fixture(scope="module")
def answers() -> dict[str, dict]:
    early, alerts = defined_detector_classes()
    names = sorted({**early, **alerts})
    out = {}
    for case, first in FIRST_IMPORTS.items():
        proc = subprocess.run([sys.executable, "-c", PROBE.format(first=first), json.dumps(names)],
                              capture_output=True, text=True, cwd=ROOT, timeout=300)
        assert proc.returncode == 0, f"{case}: {proc.stderr[-2000:]}"
        out[case] = json.loads(proc.stdout.strip().splitlines()[-1])
    return out


def test_registry_lists_every_detector_and_alert_class_defined_in_eval():
    early, alerts = defined_detector_classes()
    from eval import registry

    assert {n: c.__name__ for n, c in registry.EARLY_STOP_DETECTORS.items()} == early
    assert {n: c.__name__ for n, c in registry.ALERTS.items()} == alerts
    assert set(registry.DETECTORS) == set(early) | set(alerts)
    assert len(registry.DETECTORS) == len(early) + len(alerts)  # no name in both families


def test_registry_is_read_only():
    from eval import registry
    from eval.detectors import EvalStop

    with pytest.raises(TypeError):
        registry.DETECTORS["late"] = EvalStop  # type: ignore[index]
    with pytest.raises(AttributeError):
        registry.ALERTS.setdefault("late", EvalStop)  # type: ignore[attr-defined]


def test_every_name_builds_whatever_was_imported_first(answers):
    early, alerts = defined_detector_classes()
    want = {**early, **alerts}
    for case, got in answers.items():
        assert got["built"] == want, case


def test_registry_is_the_same_whatever_was_imported_first(answers):
    early, alerts = defined_detector_classes()
    first = next(iter(answers.values()))
    for case, got in answers.items():
        for key in ("early_stop", "alerts", "all"):
            assert got[key] == first[key], f"{case}: {key}"
        assert sorted(got["early_stop"]) == sorted(early), case


def test_generated_detector_docs_do_not_depend_on_import_order(answers):
    """studies/detector_report.render writes docs/detectors.md: its defaults list names the early-stop
    detectors (the trivial `stopat` baseline aside) and no alert, in every process."""
    early, alerts = defined_detector_classes()
    docs = {case: got["docs"] for case, got in answers.items()}
    assert len(set(docs.values())) == 1, {case: len(text) for case, text in docs.items()}
    listed = re.findall(r"^- `([a-z_]+)`: \{", next(iter(docs.values())), flags=re.M)
    assert sorted(listed) == sorted(set(early) - {"stopat"})
    assert not set(listed) & set(alerts)
