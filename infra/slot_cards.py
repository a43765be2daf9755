"""Which GPU of this host a held slot is. The Prefect limit counts slots without numbering them; a job that holds `n`
of them also claims `n` card numbers here, each an exclusive `flock` on `card-<i>.lock` in a folder per limit
(`RLHFOPS_SLOT_DIR`, default `<tmp>/rlhfops-slots`), the lowest free ones first. A lock belongs to its open file, so
threads of one process and processes of one host exclude each other alike, and the kernel drops it when the
holder dies (no stale claim after a kill -9). The job's trainer then puts itself on CUDA device (card mod visible
devices) when its config says `device: auto` (`training.job.device.resolve_device`)."""

from __future__ import annotations

import fcntl
import os
import re
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

SLOT_DIR_ENV = "RLHFOPS_SLOT_DIR"


def slot_dir(limit: str) -> Path:
    root = os.environ.get(SLOT_DIR_ENV) or str(Path(tempfile.gettempdir()) / "rlhfops-slots")
    return Path(root) / re.sub(r"[^A-Za-z0-9_.-]+", "-", limit)


@contextmanager
def claim_cards(limit: str, size: int, n: int = 1) -> Iterator[list[int]]:
    """Hold `n` of the card numbers 0..size-1 of `limit` on this host for the block; yields them, lowest first.
    RuntimeError when fewer than `n` are free: more holders here than the limit lets in (the limit's slots are taken
    before the cards, so this means another pool of that name with a larger size)."""
    folder = slot_dir(limit)
    folder.mkdir(parents=True, exist_ok=True)
    with ExitStack() as held:
        cards: list[int] = []
        for i in range(size):
            if len(cards) == n:
                break
            f = held.enter_context(open(folder / f"card-{i}.lock", "a"))
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue
            held.callback(fcntl.flock, f, fcntl.LOCK_UN)
            cards.append(i)
        if len(cards) < n:
            raise RuntimeError(f"GPU slots: {n} card numbers wanted under {folder} but only {len(cards)} of {size} "
                               "are free on this host (another pool of this limit name is larger)")
        yield cards
