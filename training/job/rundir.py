"""One writer per run directory.

Two trainers writing the same run directory interleave their `metrics.csv` rows and checkpoints: two
`rlhfops train` of one config both exited 0 with 19 of 20 rows left in `metrics.csv`. A run directory is
therefore held under an exclusive OS lock (`filelock`: `flock` on `<dir>/.lock`) for as long as a job writes
it. The kernel drops the lock when its process dies (kill -9 included), so a crashed run never leaves a stale
lock behind; a second writer fails at once with one line naming the directory and the holder.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from filelock import FileLock, Timeout

from common.errors import BadInput

LOCK_NAME = ".lock"
HOLDER_NAME = ".lock.holder"  # who holds the lock, for the error message (the lock file itself stays empty)


class RunDirBusy(BadInput):
    """Another process (or another job in this one) is writing the run directory. Bad input, not a transient
    failure: the caller named a directory that is in use, and waiting would only run the same job twice."""


def _holder(path: Path, wait_s: float = 2.0) -> str:
    # the holder takes the lock first and names itself a moment later: a writer that lost the race by a few
    # milliseconds would otherwise find no holder file yet, so wait briefly for it to appear
    deadline = time.monotonic() + wait_s
    while True:
        try:
            h = json.loads((path / HOLDER_NAME).read_text())
            return f"pid {h['pid']} on {h['host']} since {time.strftime('%H:%M:%S', time.localtime(h['since']))}"
        except (OSError, ValueError, KeyError, TypeError):
            if time.monotonic() >= deadline:
                return "another process"
            time.sleep(0.05)


@contextmanager
def locked_run_dir(path: str | Path, field: str = "out_dir") -> Iterator[Path]:
    """Hold `path` (created if needed) exclusively for the block. Raises `RunDirBusy` (a `BadInput`: exit 2 from
    the CLI, never retried in a flow) if another writer holds it; `field` names the argument to change."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    # thread_local=False: the lock belongs to the job, which may release it from another thread than the one that
    # took it (a flow's tasks run on worker threads); a second lock object on the same path still conflicts
    lock = FileLock(path / LOCK_NAME, timeout=0, thread_local=False)
    try:
        lock.acquire()
    except Timeout:
        raise RunDirBusy(f"{field}: run directory '{path}' is in use by {_holder(path)}; wait for that run to "
                         f"finish or choose another directory") from None
    try:
        # written aside and renamed into place, so a reader never sees half a file
        staged = path / f"{HOLDER_NAME}.{os.getpid()}"
        staged.write_text(json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "since": time.time()}))
        os.replace(staged, path / HOLDER_NAME)
        yield path
    finally:
        (path / HOLDER_NAME).unlink(missing_ok=True)
        lock.release()
