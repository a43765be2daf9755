"""Launching a job's ranks: locally (no Ray head: rank 0 is the caller's process, ranks 1..N-1 are spawned
processes, the rendezvous a TCP store on 127.0.0.1) or under Ray Train (`infra/ray_train.py`, in the platform layer).
Both run the same training function: `Trainer(config, ..., gpus=N, world=...)` and its `run(steps)`; `RankRestarts`
restarts either from the last checkpoint when a rank fails.

A rank that dies, hangs or raises ends the whole group: the others fail at their next collective (at once when a peer's
connection closes, within the collective timeout when it hangs), rank 0 names the rank and the cause in one line
(`RankFailed`), and every spawned rank still alive is terminated. A tenant's reward-function fault on any rank is
raised as the tenant code error it is (docs/tenant-jobs.md), so it fails the job as it does on one rank.
"""

from __future__ import annotations

import multiprocessing as mp
import socket
import traceback
from dataclasses import dataclass

from training.distributed.world import World, collective_timeout_s


class RankFailed(RuntimeError):
    """A rank of a job on several ranks died, hung or raised; the message names it and the cause in one line."""


@dataclass(frozen=True)
class Rendezvous:
    """Where rank `rank` of `size` joins its group (rank 0 hosts the store)."""

    rank: int
    size: int
    host: str = "127.0.0.1"
    port: int = 0

    def connect(self, device, alive=None) -> World:
        return World.connect(self.rank, self.size, self.host, self.port, device, alive=alive)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _rank_main(rdv: Rendezvous, trainer_cls, config, overlap: str, out_dir: str | None, resume: bool, steps: int,
               slot: int | None, errors) -> None:
    """A spawned rank: the same Trainer as rank 0 (`trainer_cls`, pickled by reference), joined to the group; its
    errors go to rank 0 before it exits 1."""
    import os

    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    try:
        trainer = trainer_cls(config, overlap, out_dir, resume=resume, slot=slot, gpus=rdv.size, world=rdv)
        for _ in trainer.run(steps):
            pass
    except BaseException as err:  # noqa: BLE001 - reported to rank 0, then this process ends
        try:
            errors.put((rdv.rank, _portable(err), traceback.format_exc(limit=4)))
        except Exception:  # noqa: BLE001
            pass
        raise SystemExit(1) from None


def _portable(err: BaseException):
    """The exception itself when it pickles (a tenant code error is re-raised as itself), else its text."""
    import pickle

    try:
        return pickle.loads(pickle.dumps(err))
    except Exception:  # noqa: BLE001
        return f"{type(err).__name__}: {err}"


def _collective(err) -> bool:
    """Whether an error is a collective's (a peer gone or silent), not a rank's own."""
    from torch.distributed import DistError

    text = str(err).lower()
    return isinstance(err, DistError | TimeoutError) or any(
        k in text for k in ("gloo", "timed out", "connection closed", "connection reset", "nccl"))


class LocalRanks:
    """Ranks 1..N-1 of a job as spawned processes on this machine; rank 0 is the caller (`world`)."""

    def __init__(self, trainer, steps: int):
        size = trainer.gpus
        self.port = free_port()
        ctx = mp.get_context("spawn")
        self.errors = ctx.Queue()
        out_dir = str(trainer.out_dir) if trainer.out_dir else None
        self.procs = []
        for r in range(1, size):
            p = ctx.Process(target=_rank_main, name=f"rlhfops-rank-{r}",
                            args=(Rendezvous(r, size, "127.0.0.1", self.port), type(trainer), trainer.cfg,
                                  trainer.overlap, out_dir,
                                  trainer.resume, steps, trainer.slot, self.errors))
            p.start()
            self.procs.append(p)
        try:
            self.world = Rendezvous(0, size, "127.0.0.1", self.port).connect(trainer.device, self._alive)
        except BaseException as err:
            named = self.failure(err)
            self.close(False)
            raise (named or err) from err

    def _alive(self) -> None:
        for r, p in enumerate(self.procs, start=1):
            if not p.is_alive():
                raise RankFailed(f"rank {r} ended while starting (exit code {p.exitcode})")

    def failure(self, err: BaseException, step: int | None = None) -> BaseException | None:
        """What rank 0 raises when a collective (or its own start) failed, in one line: a spawned rank that raised
        (its own error: a tenant code error is raised as itself), died or hung (alive, but it never reported the
        collective timeout the others hit), named; None when the error is rank 0's own (raised as it is)."""
        import queue
        import time

        reported: dict[int, object] = {}
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline:
            if all(r in reported or not p.is_alive() for r, p in enumerate(self.procs, start=1)):
                break
            try:
                rank, cause, _ = self.errors.get(timeout=0.2)
                reported.setdefault(rank, cause)
            except queue.Empty:
                pass
        at = f" in step {step}" if step is not None else ""
        for rank, cause in sorted(reported.items()):
            if not _collective(cause):
                from eval.attribution import TenantCodeError

                if isinstance(cause, TenantCodeError):
                    return cause
                text = f"{type(cause).__name__}: {cause}" if isinstance(cause, BaseException) else str(cause)
                return RankFailed(f"rank {rank} failed{at}: {text.splitlines()[0][:300]}")
        for r, p in enumerate(self.procs, start=1):
            if not p.is_alive() and p.exitcode not in (0, None):
                how = f"was killed by signal {-p.exitcode}" if p.exitcode < 0 else f"exited with code {p.exitcode}"
                return RankFailed(f"rank {r} {how}{at}; the other ranks stopped at their next collective")
        if not _collective(err):
            return None
        silent = [r for r, p in enumerate(self.procs, start=1) if p.is_alive() and r not in reported]
        if silent:
            return RankFailed(f"rank {', '.join(map(str, silent))} hung{at}: no answer within the "
                              f"{self.world_timeout():.0f} s collective timeout")
        return RankFailed(f"a collective failed{at}: {str(err).splitlines()[0][:200]}")

    def world_timeout(self) -> float:
        world = getattr(self, "world", None)
        return world.timeout_s if world is not None else collective_timeout_s()

    def close(self, finished: bool) -> None:
        """Reap the spawned ranks: a finished job's end on their own (waited for up to 60 s), the others (a failed,
        paused or stopped job) are terminated."""
        for p in self.procs:
            if finished:
                p.join(timeout=60)
            if p.is_alive():
                p.terminate()
        for p in self.procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
                p.join()
        self.errors.close()



class RankRestarts:
    """A job on several ranks restarted from its last checkpoint when a rank fails (`RankFailed`), at most
    `max_restarts` times, whatever launched its ranks: `start()` makes a fresh worker (rank 0 of the local launcher,
    or the Ray Train launcher's driver side), which resumes from the newest checkpoint in the run directory.

    The steps the restarted worker runs again (those after its checkpoint that the failed start had already given)
    are not given again: whoever consumes `run` (the supervisor: alerts, the ledger) sees every step once, and the
    tenant pays for each step once (the re-done work is the platform's). Its `metrics.csv` holds the re-run's rows,
    each step once (the trainer keeps the rows up to the checkpoint it resumes from). Past the bound the last
    failure is raised, one line naming the rank and the cause, and how often the job was restarted. Anything else a
    worker raises (a tenant code error, an out-of-memory) ends the job as on one rank. The current worker's other
    attributes (`step`, `gate_records`, `extend_gate`, ...) are read through."""

    def __init__(self, start, worker, max_restarts: int, on_restart=None):
        self.start, self.worker, self.max_restarts = start, worker, max_restarts
        self.on_restart = on_restart  # called with the RankFailed before each restart (a log line)
        self.restarts = 0

    def __getattr__(self, name: str):
        return getattr(self.__dict__["worker"], name)

    def run(self, steps: int | None = None):
        given = self.worker.step  # steps up to here were given before this run (a resumed job's replay)
        while True:
            run = self.worker.run(steps)
            try:
                for rec in run:
                    if int(rec.step) <= given:
                        continue  # run again after a restart: given once already
                    given = int(rec.step)
                    yield rec
                return
            except RankFailed as err:
                run.close()
                if not self.max_restarts:
                    raise
                if self.restarts >= self.max_restarts:
                    raise RankFailed(f"{err} (restarted {self.restarts} time{'s' * (self.restarts != 1)} from the "
                                     f"last checkpoint: max_rank_restarts {self.max_restarts})") from err
                self.restarts += 1
                if self.on_restart is not None:
                    self.on_restart(err)
                self.worker = self.start()
            finally:
                run.close()
