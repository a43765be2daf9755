"""Whether a process is still running, for tests that check what a kill leaves behind."""
from __future__ import annotations


def alive(pid: int) -> bool:
    """Running: a zombie waiting for its reaper counts as gone. A process can vanish between opening its
    /proc/PID/stat and reading it (the read then raises ProcessLookupError), so every OSError means gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in "ZX"
    except OSError:
        return False
