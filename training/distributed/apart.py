"""The reward and reference models on a process of their own (`placement: reward_apart`, OPPO's "7+1").

`scorer_placement(cfg, ref, reward_model, device)` is what the trainer asks for: the reward/reference scorers,
either in its own process (`colocated`: `IncrementalScorer`s the rollout's scorer thread runs) or apart
(`reward_apart`: an `ApartScorers` whose process holds both models). The critic is not moved: it is trained by the
policy side every step, so its prefill stays with the policy (the rollout's local scorer thread streams it as before).

Apart, one scorer process serves every policy rank of the job. Rank 0 spawns it once its ranks are joined (after the
weights are broadcast: it holds rank 0's reference and reward model), sends the address through the group, and each
rank connects to it (`multiprocessing.connection`, 127.0.0.1, an authentication key). A rollout is one session per
rank: the first `put` begins it (the prefix), each later `put` is the next decoded chunk of token ids and its mask,
sent without waiting, and the scorer process prefills it into each model's own KV cache while the actor decodes
the next; `finish` returns every model's per-column outputs (the reference's log-probs, the reward head's values)
for the whole batch, which the rollout selects rows from exactly as it does the local thread's. The same
`IncrementalScorer` code runs on the same tensors, on one torch thread like the colocated scorer thread, so the
two placements give the same scores (docs/ranks.md states the tolerance).

A scorer process that dies, hangs (no answer within the collective timeout at `finish`) or raises ends the job in one
line (`ScorerFailed`, a `RankFailed`): `the scorer process (placement reward_apart) exited with code 3 in step 2`.
Fault canary: `fault.kind: scorer_exit` (it exits with code 3 when step `at_step` + 1 begins).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import time
from multiprocessing.connection import Client, Listener, wait

import numpy as np
import torch

from training.distributed.launch import RankFailed, free_port
from training.distributed.world import World, collective_timeout_s
from training.rollout.engine import IncrementalScorer

#: what the scorer process is called in a failure's line
WHO = "the scorer process (placement reward_apart)"


class ScorerFailed(RankFailed):
    """The scorer process of a `reward_apart` job died, hung or raised; the message says which, in one line."""


def scorer_placement(cfg, ref, reward_model, device) -> tuple[dict[str, IncrementalScorer], ApartScorers | None]:
    """The job's reward/reference scoring: (local scorers, None) when colocated; ({}, the process apart) under
    `reward_apart`. The critic is the caller's (it stays with the policy)."""
    models = {}
    if ref is not None:
        models["ref"] = (ref, "logprob", cfg.ppo.temperature)
    if reward_model is not None:
        models["reward"] = (reward_model, "reward", 1.0)
    if cfg.placement == "colocated":
        return {k: IncrementalScorer(m, kind, t) for k, (m, kind, t) in models.items()}, None
    exit_at = cfg.fault.at_step + 1 if cfg.fault.kind == "scorer_exit" else None
    return {}, ApartScorers(models, str(device), cfg.dtype, exit_at)


def _serve(port: int, authkey: bytes, clients: int, models: dict, device: str, dtype: str, exit_at: int | None
           ) -> None:
    """The scorer process: accept one connection per policy rank, then answer sessions until every rank closed."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    torch.set_num_threads(1)
    from training.job.device import autocast

    dev = torch.device(device)
    listener = Listener(("127.0.0.1", port), authkey=authkey)
    conns = [listener.accept() for _ in range(clients)]
    listener.close()
    scorers = {id(c): {k: IncrementalScorer(m.to(dev), kind, t) for k, (m, kind, t) in models.items()}
               for c in conns}
    outs: dict[int, dict[str, list[torch.Tensor]] | None] = {id(c): None for c in conns}
    errors: dict[int, str | None] = {id(c): None for c in conns}
    while conns:
        for c in wait(conns):
            try:
                msg = c.recv()
            except (EOFError, OSError):
                conns.remove(c)
                continue
            op, key = msg[0], id(c)
            if op == "close":
                conns.remove(c)
                c.close()
                continue
            if op == "finish":
                if errors[key] is not None:
                    c.send(("error", errors[key]))
                else:
                    c.send(("ok", {k: torch.cat(v, 1).numpy() for k, v in (outs[key] or {}).items()}))
                for s in scorers[key].values():
                    s.release()
                outs[key], errors[key] = None, None
                continue
            if op == "begin" and exit_at is not None and msg[1] == exit_at:
                os._exit(3)
            ids, mask = (torch.from_numpy(a).to(dev) for a in msg[-2:])
            if op == "begin":
                outs[key], errors[key] = {k: [] for k in scorers[key]}, None
            if errors[key] is not None:
                continue
            try:
                with autocast(dev, dtype):
                    for k, s in scorers[key].items():
                        outs[key][k].append((s.begin(ids, mask) if op == "begin" else s.extend(ids, mask)).cpu())
            except Exception as err:  # noqa: BLE001 - answered at this session's finish
                errors[key] = f"{type(err).__name__}: {err}".splitlines()[0][:300]


class _Session:
    """One rollout's stream to the scorer process (the rollout's `put`/`finish`, as its local scorer thread)."""

    def __init__(self, owner: ApartScorers):
        self.owner, self.begun = owner, False

    def put(self, ids: torch.Tensor, mask: torch.Tensor) -> None:
        a, m = ids.detach().cpu().numpy(), mask.detach().cpu().numpy()
        msg = ("extend", a, m) if self.begun else ("begin", self.owner.step, a, m)
        self.begun = True
        self.owner.send(msg)

    def finish(self) -> dict[str, torch.Tensor]:
        if not self.begun:
            return {}
        self.owner.send(("finish",))
        status, got = self.owner.answer()
        if status != "ok":
            raise ScorerFailed(f"{WHO} failed in step {self.owner.step}: {got}")
        return {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in got.items()}


class ApartScorers:
    """The client side of the scorer process (see the module docstring): `start` once the ranks are joined,
    `session()` per rollout, `close` at the job's end. `step`: the step being rolled out (for the failure's line)."""

    def __init__(self, models: dict, device: str, dtype: str, exit_at: int | None = None):
        self.models, self.device, self.dtype, self.exit_at = models, device, dtype, exit_at
        self.names = tuple(models)
        self.proc = None
        self.conn = None
        self.step = 0
        self.failed = False  # it died or hung: `close` does not wait for it
        self.timeout_s = collective_timeout_s()

    def start(self, world: World) -> None:
        """Rank 0 spawns the scorer process; every rank connects to it. Idempotent."""
        if self.conn is not None:
            return
        address = None
        if world.rank == 0:
            port, key = free_port(), os.urandom(16)
            device = self.device
            if device.startswith("cuda"):  # pragma: no cover - needs a GPU: the card after the policy ranks'
                device = f"cuda:{(torch.device(device).index or 0) + world.size}"
            proc = mp.get_context("spawn").Process(
                target=_serve, name="rlhfops-scorer",
                args=(port, key, world.size, self.models, device, self.dtype, self.exit_at))
            proc.start()
            self.proc = proc
            address = (port, key)
        port, key = world.broadcast_object(address)
        deadline = time.monotonic() + float(os.environ.get("RLHFOPS_RANK_START_TIMEOUT_S", 900.0))
        while True:
            try:
                self.conn = Client(("127.0.0.1", port), authkey=key)
                return
            except (ConnectionRefusedError, FileNotFoundError):
                if self.proc is not None and not self.proc.is_alive():
                    raise ScorerFailed(f"{WHO} ended while starting (exit code {self.proc.exitcode})") from None
                if time.monotonic() > deadline:
                    raise ScorerFailed(f"{WHO} did not start within the start timeout") from None
                time.sleep(0.1)

    def session(self) -> _Session:
        if self.conn is None:
            raise RuntimeError("ApartScorers.start was not called")
        return _Session(self)

    def send(self, msg) -> None:
        try:
            self.conn.send(msg)
        except (OSError, EOFError) as err:
            raise self._gone() from err

    def answer(self):
        try:
            if not self.conn.poll(self.timeout_s):
                self.failed = True
                raise ScorerFailed(f"{WHO} hung in step {self.step}: no answer within the {self.timeout_s:.0f} s "
                                   "collective timeout")
            return self.conn.recv()
        except (OSError, EOFError) as err:
            raise self._gone() from err

    def _gone(self) -> ScorerFailed:
        """The connection broke: the process's end, in one line (rank 0 knows its exit code)."""
        self.failed = True
        at = f" in step {self.step}"
        if self.proc is not None:
            self.proc.join(timeout=2.0)
            code = self.proc.exitcode
            if code is not None:
                how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
                return ScorerFailed(f"{WHO} {how}{at}; the policy ranks stopped")
        return ScorerFailed(f"{WHO} ended{at}: its link to this rank broke")

    def close(self) -> None:
        """Tell the scorer process this rank is done; rank 0 reaps it (after up to 10 s, or at once when it died or
        hung: terminated, then killed)."""
        if self.conn is not None:
            try:
                if not self.failed:
                    self.conn.send(("close",))
            except (OSError, EOFError):
                pass
            self.conn.close()
            self.conn = None
        if self.proc is not None:
            self.proc.join(timeout=0 if self.failed else 10)
            if self.proc.is_alive():
                self.proc.terminate()
                self.proc.join(timeout=2)
            if self.proc.is_alive():
                self.proc.kill()  # a stopped process takes SIGKILL, not SIGTERM
                self.proc.join()
            self.proc = None
