"""A job's ranks as Ray Train workers: `ray.train.torch.TorchTrainer` runs one worker per rank, each the same training
function the local launcher runs (`training.trainer.Trainer(config, ..., gpus=N, world=...)` and its `run(steps)`),
joined to the process group Ray Train made (torch.distributed's default group: gloo on CPU, the collective timeout
of `RLHFOPS_COLLECTIVE_TIMEOUT_S`), seen by the trainer as a `training.distributed.world.World`. The trainer asks
its `World` for its rank and the collectives; it never learns which launcher started it. Ray stays here, in the
platform layer (the import contract keeps it out of training/).

`RayRanks` is the driver's side, shaped like a trainer for `training.job.lifecycle.run_job`: its `run(steps)` starts
the Ray Train run and yields rank 0's step records as they come, in lock step (rank 0 waits for the driver's word
after every step, and all ranks take it at one broadcast, so a stop, a pause or a page of the supervisor ends every
rank after the same step, as closing the local launcher's run does). Rank 0 alone writes the run directory, which
must be one every node sees (one machine here; a shared volume on KubeRay). A rank that dies, hangs or raises ends
the run (`FailureConfig(max_failures=0)`): `RankFailed` names it in one line, and the platform's bounded retry
(`training.distributed.launch.RankRestarts`: a fresh `RayRanks` resumes from the last checkpoint) takes it from
there, as it does for the local launcher. docs/ranks.md.
"""

from __future__ import annotations

import os
import tempfile
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from common.errors import BadInput
from training.distributed.launch import RankFailed, _collective
from training.distributed.world import collective_timeout_s

#: `RLHFOPS_RAY_PLACEMENT`: how Ray Train places a job's ranks (PACK: as few nodes as fit; SPREAD: one per node
#: where it can; Ray's placement-group strategies)
PLACEMENT_ENV = "RLHFOPS_RAY_PLACEMENT"
PLACEMENTS = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")


def placement() -> str:
    raw = os.environ.get(PLACEMENT_ENV, "").strip().upper() or "PACK"
    if raw not in PLACEMENTS:
        raise BadInput(f"{PLACEMENT_ENV}: '{raw}' is not one of {', '.join(PLACEMENTS)}")
    return raw


def check_ray_train() -> None:
    """`runner: ray` needs Ray Train (the `ray` extra); BadInput naming the runner otherwise."""
    try:
        import ray.train.torch  # noqa: F401
    except ImportError:
        raise BadInput("runner: 'ray' needs ray[train], which is not installed; run `pip install '.[ray]'` (or use "
                       "runner 'thread')") from None


def rank_resources(gpus: int, cluster: dict[str, float]) -> tuple[bool, dict[str, float]]:
    """(use_gpu, resources per worker) of a job of `gpus` ranks on a cluster with these total resources: a GPU each
    on a cluster with GPUs, else one CPU and one `gpu_slot` (the GPU stand-in of a local head) each where the
    cluster declares slots, else one CPU each."""
    from infra.provision import SLOT_RESOURCE

    if cluster.get("GPU", 0) > 0:
        kind, have, out = "GPU", cluster["GPU"], (True, {"CPU": 1.0, "GPU": 1.0})
    elif cluster.get(SLOT_RESOURCE, 0) > 0:
        kind, have, out = SLOT_RESOURCE, cluster[SLOT_RESOURCE], (False, {"CPU": 1.0, SLOT_RESOURCE: 1.0})
    else:
        kind, have, out = "CPU", cluster.get("CPU", 0), (False, {"CPU": 1.0})
    if gpus > have:
        raise BadInput(f"gpus: the job asks for {gpus} ranks but the Ray cluster has {have:g} {kind}; lower it or "
                       "add nodes")
    return out


@contextmanager
def ray_session() -> Iterator[bool]:
    """Ray for the block: the running one, else the cluster at `RAY_ADDRESS`, else a local head on loopback
    (`infra.provision.ray_init_kwargs`), shut down at the end if this block started it. Yields whether it did."""
    import ray

    if ray.is_initialized():
        yield False
        return
    from infra.provision import ray_init_kwargs

    address = os.environ.get("RAY_ADDRESS", "").strip() or None
    ray.init(address=address, **ray_init_kwargs(address))
    try:
        yield True
    finally:
        ray.shutdown()


# ------------------------------------------------------------------------------------------------- a Ray worker
def rank_loop(config: dict[str, Any]) -> None:
    """One Ray Train worker: one rank. The trainer on the group Ray Train made; rank 0 hands each step's record to
    the driver and waits for its word ("go", "stop", or a gate extension to run first); every rank takes the word
    at one broadcast, so all stop after the same step."""
    import ray

    from training.distributed.world import World

    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    world = World.from_default_group()
    to_driver, from_driver = config["to_driver"], config["from_driver"]
    trainer = config["trainer_cls"](config["config"], config["overlap"], config["out_dir"], resume=True,
                                    gpus=world.size, world=world)
    nodes = world.gather(ray.get_runtime_context().get_node_id())
    if world.is_main:
        to_driver.put(("start", trainer.step, nodes))
    run = trainer.run(config["steps"])
    try:
        for rec in run:
            go = True
            if world.is_main:
                to_driver.put(("step", rec, trainer.gate_records.get(int(rec.step))))
                go = _driver_word(trainer, to_driver, from_driver)
            if not world.broadcast_object(go):
                break
    finally:
        run.close()


def _driver_word(trainer, to_driver, from_driver) -> bool:
    """Rank 0 after a step: run the gate extensions the driver asks for, until it says go (True) or stop."""
    while True:
        msg = from_driver.get()
        if msg[0] == "extend":
            to_driver.put(("extended", trainer.extend_gate(msg[1])))
            continue
        return msg[0] == "go"


# ---------------------------------------------------------------------------------------------- the driver's side
class RayRanks:
    """A job's `gpus` ranks under Ray Train, driven like a trainer (`step`, `run`, `gate_records`, `extend_gate`;
    see the module docstring). `step`: the step it resumes from (the newest checkpoint in `out_dir`), then the last
    step given. `nodes`: the Ray node of each rank, once the run has started."""

    def __init__(self, config, overlap: str, out_dir: str | Path | None, gpus: int, *, trainer_cls=None,
                 placement_strategy: str | None = None, name: str = "rlhfops-job"):
        from training.checkpoint import latest_checkpoint
        from training.job.lifecycle import step_of

        if trainer_cls is None:
            from training.trainer import Trainer as trainer_cls
        self.cfg, self.overlap, self.gpus, self.trainer_cls = config, overlap, gpus, trainer_cls
        self.out_dir = Path(out_dir).resolve() if out_dir else None
        self.placement = placement_strategy or placement()
        self.name = name
        ckpt = latest_checkpoint(self.out_dir) if self.out_dir else None
        self.step = step_of(ckpt) if ckpt is not None else 0
        self.gate_records: dict[int, Any] = {}
        self.nodes: list[str] = []
        self._link = None

    def run(self, steps: int | None = None) -> Iterator[Any]:
        total = int(steps if steps is not None else self.cfg.steps)
        with ray_session():
            yield from self._run(total)

    def _trainer(self, total: int, to_driver, from_driver):
        import ray
        from ray.train import FailureConfig, RunConfig, ScalingConfig
        from ray.train.torch import TorchConfig, TorchTrainer

        use_gpu, per_worker = rank_resources(self.gpus, ray.cluster_resources())
        storage = (self.out_dir / "ray-train") if self.out_dir else Path(tempfile.gettempdir()) / "rlhfops-ray-train"
        return TorchTrainer(
            rank_loop,
            train_loop_config={"config": self.cfg, "overlap": self.overlap, "steps": total, "to_driver": to_driver,
                               "from_driver": from_driver, "trainer_cls": self.trainer_cls,
                               "out_dir": str(self.out_dir) if self.out_dir else None},
            scaling_config=ScalingConfig(num_workers=self.gpus, use_gpu=use_gpu, resources_per_worker=per_worker,
                                         placement_strategy=self.placement),
            torch_config=TorchConfig(backend="gloo", timeout_s=int(collective_timeout_s())),
            run_config=RunConfig(name=f"{self.name}-{uuid.uuid4().hex[:8]}", storage_path=str(storage),
                                 failure_config=FailureConfig(max_failures=0)))

    def _run(self, total: int) -> Iterator[Any]:
        import ray
        from ray.util.queue import Queue

        to_driver, from_driver = Queue(actor_options={"num_cpus": 0}), Queue(actor_options={"num_cpus": 0})
        self._link = (to_driver, from_driver)
        trainer = self._trainer(total, to_driver, from_driver)
        ended: dict[str, BaseException | None] = {}

        def fit() -> None:
            try:
                trainer.fit()
                ended["error"] = None
            except BaseException as err:  # noqa: BLE001 - raised by the generator, named
                ended["error"] = err

        thread = threading.Thread(target=fit, name="rlhfops-ray-train", daemon=True)
        thread.start()
        try:
            while True:
                msg = self._next(to_driver, thread)
                if msg is None:
                    break
                if msg[0] == "start":
                    self.nodes = list(msg[2])
                    continue
                rec, records = msg[1], msg[2]
                if records:
                    self.gate_records[int(rec.step)] = records
                self.step = int(rec.step)
                yield rec
                from_driver.put(("go",))
            thread.join()
            if ended.get("error") is not None:
                raise rank_failure(ended["error"], self.step + 1, self.gpus) from ended["error"]
        finally:
            if thread.is_alive():  # stopped by the consumer: every rank ends after the step rank 0 is at
                from_driver.put(("stop",))
                thread.join(timeout=max(60.0, collective_timeout_s() + 30.0))
            self._link = None
            for q in (to_driver, from_driver):
                ray.kill(q.actor)

    @staticmethod
    def _next(to_driver, thread: threading.Thread):
        """The next message from rank 0, or None once the run has ended and nothing is left."""
        from ray.util.queue import Empty

        while True:
            alive = thread.is_alive()
            try:
                return to_driver.get(timeout=0.5)
            except Empty:
                if not alive:
                    return None

    def extend_gate(self, pair: tuple[int, ...]):
        """Rank 0 scores the next held-out batch for the two checkpoints of a close gate decision (the trainer's
        `extend_gate`), between two steps."""
        if self._link is None:
            raise RuntimeError("extend_gate: the ranks are not running")
        to_driver, from_driver = self._link
        from_driver.put(("extend", tuple(pair)))
        msg = to_driver.get()
        return msg[1]


def rank_failure(err: BaseException, step: int, size: int) -> BaseException:
    """What a failed Ray Train run raises, in one line: a tenant code error as itself; a rank that raised, named with
    its error; a rank whose worker died, named; else, when the only errors are collectives' (a peer gone silent),
    the ranks that reported nothing, as hung."""
    from eval.attribution import TenantCodeError

    failures: dict[int, BaseException] = dict(getattr(err, "worker_failures", None) or {})
    at = f" in step {step}"
    if not failures:
        return RankFailed(f"the Ray Train run failed{at}: {_first_line(err)}")
    for _rank, cause in sorted(failures.items()):
        inner = _cause(cause)
        if isinstance(inner, TenantCodeError):
            return inner
    for rank, cause in sorted(failures.items()):
        text = _first_line(_cause(cause))
        if "health check failed" in text.lower() or "actor died" in text.lower():
            return RankFailed(f"rank {rank} died{at} (its Ray Train worker process exited); the other ranks "
                              "stopped at their next collective")
    for rank, cause in sorted(failures.items()):
        inner = _cause(cause)
        if not _collective(inner):
            return RankFailed(f"rank {rank} failed{at}: {type(inner).__name__}: {_first_line(inner)}")
    silent = [r for r in range(size) if r not in failures]
    if silent:
        return RankFailed(f"rank {', '.join(map(str, silent))} hung{at}: no answer within the "
                          f"{collective_timeout_s():.0f} s collective timeout")
    return RankFailed(f"a collective failed{at}: {_first_line(_cause(next(iter(failures.values()))))}")


def _cause(err: BaseException) -> BaseException:
    """The user's exception inside Ray's wrappers."""
    seen = 0
    while seen < 5:
        inner = getattr(err, "cause", None) or err.__cause__
        if not isinstance(inner, BaseException) or inner is err:
            return err
        err, seen = inner, seen + 1
    return err


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return (text[0] if text else type(err).__name__)[:300]

