"""A job's ranks: its rank, its world size, the process group (with a timeout on every collective) and the few
collectives the trainer needs. At world size 1 (`LOCAL`) every collective is a no-op that returns its input, so the
one-process trainer runs the same code with nothing to wait on.

The group is a standalone gloo group (`ProcessGroupGloo(store, rank, size, timeout)`) on a TCP store, not
torch.distributed's process-global default group: two jobs in one process (the platform round's threads) each have
their own, and a test can run two ranks as two threads. On `cuda` the gradients go over a standalone NCCL group on the
same store (never run here: no two GPUs were lent to this work); the small objects and counts stay on gloo.
Under Ray Train the default group Ray made is used instead (`World.from_default_group`).

`idle_s` sums the seconds this rank spent inside collectives since `take_idle()` was last called: the time it waited
on the slowest rank (the trainer reports the largest over ranks per step as `rank_idle_s`).
"""

from __future__ import annotations

import datetime
import os
import pickle
import time
from collections.abc import Sequence

import torch

#: the timeout of every collective (seconds) unless the job says otherwise (`RLHFOPS_COLLECTIVE_TIMEOUT_S`)
DEFAULT_TIMEOUT_S = 300.0


def collective_timeout_s() -> float:
    return float(os.environ.get("RLHFOPS_COLLECTIVE_TIMEOUT_S", DEFAULT_TIMEOUT_S))


def rank_threads(world_size: int, device_type: str = "cpu", default: int = 1) -> int:
    """torch threads of one rank: `OMP_NUM_THREADS` when set, else the cores divided among the ranks (at least one).
    A one-rank job keeps its config's `oppo.torch_threads` (`default`)."""
    if world_size <= 1:
        return default
    env = os.environ.get("OMP_NUM_THREADS", "").strip()
    if env.isdigit() and int(env) > 0:
        return int(env)
    return max(1, (os.cpu_count() or 1) // world_size)


class World:
    """One rank's view of the job's ranks. `rank`, `size`; collectives on `pg` (None at size 1)."""

    def __init__(self, rank: int = 0, size: int = 1, pg=None, grad_pg=None, timeout_s: float = DEFAULT_TIMEOUT_S,
                 store=None):
        self.rank, self.size, self.pg, self.timeout_s = rank, size, pg, timeout_s
        self.grad_pg = grad_pg if grad_pg is not None else pg
        self.store = store  # kept alive with the group
        self.idle_s = 0.0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    # ---- construction -----------------------------------------------------------------------------------------
    @classmethod
    def connect(cls, rank: int, size: int, host: str, port: int, device: torch.device | str = "cpu",
                timeout_s: float | None = None, alive=None) -> World:
        """Join the job's group: rank 0 hosts the TCP store on host:port, the others connect. A rank starting up
        (imports, models) may take minutes on a loaded machine, so rank 0 first waits for every rank's `ready` key
        (up to `RLHFOPS_RANK_START_TIMEOUT_S`, default 900 s, calling `alive()` between looks: it raises when a rank
        died starting), then the group forms under the collective timeout."""
        from torch.distributed import ProcessGroupGloo, TCPStore

        timeout_s = collective_timeout_s() if timeout_s is None else timeout_s
        td = datetime.timedelta(seconds=timeout_s)
        start_s = float(os.environ.get("RLHFOPS_RANK_START_TIMEOUT_S", 900.0))
        store = TCPStore(host, port, size, rank == 0, timeout=datetime.timedelta(seconds=max(start_s, timeout_s)),
                         wait_for_workers=False)
        store.set(f"rlhfops/ready/{rank}", "1")
        if rank == 0:
            keys = [f"rlhfops/ready/{r}" for r in range(size)]
            deadline = time.monotonic() + start_s
            while not store.check(keys):
                if alive is not None:
                    alive()
                if time.monotonic() > deadline:
                    raise TimeoutError(f"ranks did not start within {start_s:.0f} s")
                time.sleep(0.2)
        store.set_timeout(td)
        pg = ProcessGroupGloo(store, rank, size, td)
        grad_pg = None
        if torch.device(device).type == "cuda":  # pragma: no cover - needs two GPUs
            from torch.distributed import PrefixStore, ProcessGroupNCCL

            opts = ProcessGroupNCCL.Options()
            opts._timeout = td
            grad_pg = ProcessGroupNCCL(PrefixStore("nccl", store), rank, size, opts)
        world = cls(rank, size, pg, grad_pg, timeout_s, store)
        world.barrier()
        return world

    @classmethod
    def from_default_group(cls, timeout_s: float | None = None) -> World:  # pragma: no cover - under Ray Train
        """The group torch.distributed's default group holds (Ray Train's TorchTrainer made it)."""
        import torch.distributed as dist

        pg = dist.distributed_c10d._get_default_group()
        return cls(dist.get_rank(), dist.get_world_size(), pg, None,
                   collective_timeout_s() if timeout_s is None else timeout_s)

    # ---- collectives ------------------------------------------------------------------------------------------
    def _wait(self, work) -> None:
        t = time.perf_counter()
        work.wait()
        self.idle_s += time.perf_counter() - t

    def take_idle(self) -> float:
        out, self.idle_s = self.idle_s, 0.0
        return out

    def sum(self, values: Sequence[float]) -> list[float]:
        """Element-wise sum over ranks (float64)."""
        return self._reduce(values, "sum")

    def max(self, values: Sequence[float]) -> list[float]:
        return self._reduce(values, "max")

    def _reduce(self, values: Sequence[float], op: str) -> list[float]:
        if self.size == 1:
            return [float(v) for v in values]
        from torch.distributed import AllreduceOptions, ReduceOp

        t = torch.tensor([float(v) for v in values], dtype=torch.float64)
        opts = AllreduceOptions()
        opts.reduceOp = ReduceOp.SUM if op == "sum" else ReduceOp.MAX
        self._wait(self.pg.allreduce([t], opts))
        return t.tolist()

    def gather(self, obj) -> list:
        """Every rank's `obj`, in rank order (pickled; for the step's samples and small records)."""
        if self.size == 1:
            return [obj]
        data = torch.frombuffer(bytearray(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)), dtype=torch.uint8)
        sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(self.size)]
        self._wait(self.pg.allgather([sizes], [torch.tensor([data.numel()], dtype=torch.int64)]))
        width = int(max(int(s) for s in sizes))
        padded = torch.zeros(width, dtype=torch.uint8)
        padded[: data.numel()] = data
        out = [torch.zeros(width, dtype=torch.uint8) for _ in range(self.size)]
        self._wait(self.pg.allgather([out], [padded]))
        return [pickle.loads(o[: int(s)].numpy().tobytes()) for o, s in zip(out, sizes, strict=True)]

    def broadcast_object(self, obj):
        """Rank 0's `obj` on every rank."""
        return obj if self.size == 1 else self.gather(obj if self.rank == 0 else None)[0]

    def broadcast_module(self, module: torch.nn.Module | None) -> None:
        """Rank 0's weights into every rank's copy (the start of a job: every rank begins where rank 0 is)."""
        if self.size == 1 or module is None:
            return
        from torch.distributed import BroadcastOptions

        opts = BroadcastOptions()
        opts.rootRank = 0
        with torch.no_grad():
            for t in module.state_dict().values():
                buf = t.detach().to("cpu", copy=True).contiguous()
                self._wait(self.pg.broadcast([buf], opts))
                t.copy_(buf.to(t.device))

    def reduce_grads(self, params) -> None:
        """Sum every parameter's gradient over ranks (a missing one counts as zeros), in one flat buffer: the manual
        all-reduce DDP does in buckets. The loss each rank differentiated is already divided by the global token
        count, so the sum is the full batch's gradient."""
        if self.size == 1:
            return
        params = [p for p in params if p.requires_grad]
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        flat = torch.cat([g.reshape(-1) for g in grads])
        self._wait(self.grad_pg.allreduce([flat]))
        off = 0
        for p in params:
            n = p.numel()
            p.grad = flat[off : off + n].view_as(p).clone()
            off += n

    def barrier(self) -> None:
        if self.size > 1:
            self.sum([0.0])


#: the one-process job
LOCAL = World()
