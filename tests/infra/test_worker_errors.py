"""Errors from compute-pool processes say why, and errors that cannot go away are not retried.

Under a Prefect worker, `flows/platform.py` shadowed the standard library's `platform` in every spawned
pool process: they died at import, the flow said only `BrokenProcessPool` and retried five times."""

from __future__ import annotations

import sys
import textwrap

import pytest

from infra import compute
from tasks.retry import InjectedFault, is_transient


@pytest.fixture()
def victim(tmp_path, monkeypatch):
    """A module whose import needs `platform`, next to a `platform.py` that shadows the standard library in
    any fresh process that puts this folder first on sys.path (this process already holds the real one)."""
    (tmp_path / "platform.py").write_text("raise RuntimeError('this platform.py shadows the standard library')\n")
    (tmp_path / "victim_mod.py").write_text(textwrap.dedent("""
        import os
        import platform


        def echo(x):
            return x


        def die(x):
            os._exit(3)
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "victim_mod", raising=False)
    import victim_mod

    return victim_mod


def test_a_pool_process_that_cannot_start_names_the_root_cause_and_is_not_retried(victim):
    with compute.compute_pool(workers=2):
        with pytest.raises(compute.WorkerStartError) as info:
            compute.compute(victim.echo, 1)
    message = str(info.value)
    assert "this platform.py shadows the standard library" in message
    assert "BrokenProcessPool" in message and "victim_mod.echo" in message
    assert not is_transient(info.value)


def test_a_pool_process_killed_mid_task_is_retried_on_a_fresh_pool(victim, tmp_path, monkeypatch):
    (tmp_path / "platform.py").unlink()  # the module imports fine: the process dies of something else
    with compute.compute_pool(workers=2):
        with pytest.raises(compute.WorkerProcessDied) as info:
            compute.compute(victim.die, 1)
        assert is_transient(info.value)
        assert compute.compute(victim.echo, 7) == 7  # the retry runs: the broken pool was replaced


@pytest.mark.parametrize("exc, transient", [
    (InjectedFault("x"), True),
    (ConnectionError("server gone"), True),
    (TimeoutError(), True),
    (ImportError("no module named x"), False),
    (ModuleNotFoundError("x"), False),
    (NameError("undefined"), False),
    (NotImplementedError(), False),
    (AssertionError(), False),
    (ValueError("bad"), False),
])
def test_what_is_retried(exc, transient):
    assert is_transient(exc) is transient


def test_a_permanent_root_cause_anywhere_in_the_chain_is_not_retried():
    try:
        try:
            raise ImportError("partially initialized module 'platform'")
        except ImportError as inner:
            raise RuntimeError("wrapper") from inner
    except RuntimeError as outer:
        assert not is_transient(outer)
    assert is_transient(RuntimeError("wrapper of nothing"))
