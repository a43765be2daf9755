"""`infra.slot_cards`: a job that holds GPU slots also holds as many card numbers of its host, the lowest free ones,
exclusive across threads and processes and given back when the holder ends (kill -9 included). Oracle: the numbers
written out by hand for each sequence of claims, and another process's `flock` on the same files."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest


@pytest.fixture(autouse=True)
def _slot_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("RLHFOPS_SLOT_DIR", str(tmp_path / "slots"))


def test_claims_take_the_lowest_free_cards_and_give_them_back():
    from infra.slot_cards import claim_cards

    with claim_cards("gpu", 4) as a, claim_cards("gpu", 4, 2) as b:
        assert (a, b) == ([0], [1, 2])
        with claim_cards("gpu", 4) as c:
            assert c == [3]
            with pytest.raises(RuntimeError, match="only 0 of 4 are free"), claim_cards("gpu", 4):
                pass
        with claim_cards("other-limit", 4) as d:
            assert d == [0]  # each limit numbers its own cards
    with claim_cards("gpu", 4) as e:
        assert e == [0]  # all given back


def test_a_card_another_process_holds_is_skipped_until_that_process_dies(tmp_path):
    from infra.slot_cards import claim_cards, slot_dir

    folder = slot_dir("gpu")
    folder.mkdir(parents=True)
    ready = tmp_path / "ready"
    holder = subprocess.Popen([sys.executable, "-c", (
        "import fcntl, pathlib, sys, time; f = open(sys.argv[1], 'a'); fcntl.flock(f, fcntl.LOCK_EX); "
        "pathlib.Path(sys.argv[2]).write_text('1'); time.sleep(60)"), str(folder / "card-0.lock"), str(ready)])
    try:
        for _ in range(200):
            if ready.exists():
                break
            time.sleep(0.05)
        with claim_cards("gpu", 2) as cards:
            assert cards == [1]
    finally:
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait()
    with claim_cards("gpu", 2) as cards:
        assert cards == [0]  # the kernel dropped the dead holder's lock


def test_a_platform_jobs_worker_is_started_on_its_slot_card(monkeypatch):
    """Two jobs holding slots of one pool at once: the second's trainer is built with `slot=1`, the first's with 0."""
    from types import SimpleNamespace

    import tasks.training as TT
    from infra.provision import SlotPool

    built = []
    monkeypatch.setattr(TT, "Trainer", lambda *a, **k: built.append(k["slot"]) or "trainer")
    pool = SlotPool(2, "cards-test", backend="local")
    spec = SimpleNamespace(gpus=1, steps=3, job="t/j", config=None, overlap="none", out_dir="x", runner="thread")
    first, second = TT.PrefectJobHooks(None, pool), TT.PrefectJobHooks(None, pool)
    with first.hold_slots(spec), second.hold_slots(spec):
        assert (first.card, second.card) == (0, 1)
        TT.start_worker.fn(spec.job, None, "none", "x", card=second.card)
        TT.start_worker.fn(spec.job, None, "none", "x", card=first.card)
    assert built == [1, 0] and first.card is None and second.card is None
