"""RunSupervisor: drives one live run's state machine (eval/states.py) from the trainer's per-step records.

It lives apart from the state machine so that `eval/states.py` (states, transitions) and `eval/attribution.py`
(failure classes and reasons, which need the states' `FailureClass`) import in one direction only: this module
uses both, neither uses it.

A run the eval gate paused can be resumed (`resume_after_pause`): the history then reads
`... RUNNING, PAUSED_BY_GATE(reason), RUNNING, ...`, the gate detector starts afresh from the resume point (the
tenant overrode its verdict; it needs new evidence to stop the run again), and the attribution of the run's end
says where it was paused and from which checkpoint it went on.
"""

from __future__ import annotations

from typing import Any

from eval.states import RunState, RunStatus


class RunSupervisor:
    """Drives one live run from the trainer's per-step records (`training.metrics.StepRecord`): feeds the
    alert catalog, moves the run state on paging alerts, pauses at the next checkpoint (a step whose eval
    gate ran, i.e. `gold_eval` is not NaN) when asked to or when the gate detector says stop, and charges
    the ledger and Prometheus metrics if given (duck-typed: `infra.ledger.Ledger`,
    `infra.metrics.PlatformMetrics`).

        spec, sup = training.job.request.build(request)   # the one place a job's supervisor is made
        sup.begin()
        for record in train(...):
            sup.observe(record)
            if sup.machine.state is RunState.PAUSED_BY_GATE: break
        sup.finish(completed=True)
    """

    def __init__(
        self, run_id: str, tenant: str | None, monitor: Any, gate_detector: Any = None, ledger: Any = None,
        metrics: Any = None, gpu_kind: str = "cpu", n_gpus: int = 1, planned_steps: int | None = None,
    ):
        from eval.states import RunStateMachine

        self.machine = RunStateMachine(run_id, tenant)
        self.monitor = monitor
        self.gate_detector = gate_detector
        self.gate_monitor = gate_detector.start() if gate_detector is not None else None
        self.ledger, self.metrics = ledger, metrics
        self.gpu_kind, self.n_gpus = gpu_kind, n_gpus
        #: the run's planned length: the gate detector sees each checkpoint's progress (step / planned steps), which
        #: the default detector's short-run phase needs (it judges a short run only late in its planned length)
        self.planned_steps = planned_steps
        self.events: list[Any] = []
        self.steps = 0
        #: (paused at step, reason, resumed from checkpoint step) for every pause this run was resumed from
        self.pauses: list[tuple[int | None, str, int]] = []
        #: the gate's extensions on close decisions: how many, and the eval seconds they took (charged to `eval`)
        self.extensions = 0
        self.extra_eval_s = 0.0

    def _publish(self) -> None:
        if self.metrics is not None:
            self.metrics.set_state(self.machine.run_id, self.machine.tenant, self.machine.state.value)

    def begin(self) -> None:
        self.provision()
        self.start()

    def provision(self) -> None:
        self.machine.provision()
        self._publish()

    def start(self) -> None:
        self.machine.start()
        self._publish()

    def observe(self, record: Any, charge: bool = True, prompts: Any = None, extend: Any = None) -> list[Any]:
        """One committed step. Returns the alert events that fired at it. `charge=False`: a step replayed from an
        earlier segment of the run that was charged then (the ledger and the step metrics skip it).

        `prompts` (prompt id -> gold score at this step's gate) goes to a gate detector that needs per-prompt scores
        (`needs` holds "prompt_scores", e.g. `paired`). `extend(pair) -> ({step: {prompt id: score}}, seconds)`
        scores more held-out prompts for the two checkpoints of a close decision (the trainer's `extend_gate`):
        while the detector wants more evidence and `extend` returns scores, they are added and the detector decides
        again; the seconds are charged to the tenant in the ledger's `eval` phase."""
        from eval.detectors import NAN, Checkpoint
        from eval.health import HealthCheckpoint

        run_id, tenant = self.machine.run_id, self.machine.tenant
        self.steps += 1
        if charge and self.ledger is not None:
            self.ledger.charge_step(run_id, tenant, self.gpu_kind, record, n_gpus=self.n_gpus)
        if charge and self.metrics is not None:
            self.metrics.observe_step(run_id, tenant, record, n_gpus=self.n_gpus)
        events = self.monitor.observe(HealthCheckpoint.from_step_record(record))
        for ev in events:
            self.events.append(ev)
            self.machine.on_alert(ev)
            if self.metrics is not None:
                self.metrics.observe_alert(ev)
        gold = float(record.gold_eval)
        if gold == gold:  # a gate ran: this step is a checkpoint
            stop = False
            if self.gate_monitor is not None:
                # the gate's SE and the proxy reward: what the noise-aware detectors scale and test with
                progress = record.step / self.planned_steps if self.planned_steps else NAN
                cp = Checkpoint(step=float(record.step), eval_score=gold,
                                eval_se=float(getattr(record, "gold_eval_se", NAN)),
                                reward=float(getattr(record, "reward_mean", NAN)), progress=progress)
                if "prompt_scores" in getattr(self.gate_detector, "needs", ()):
                    stop = bool(self.gate_monitor.observe(cp, prompts))
                    if extend is not None and prompts is not None:
                        stop = self._extend(extend, stop, charge)
                else:
                    stop = bool(self.gate_monitor.observe(cp))
            self.machine.on_checkpoint(int(record.step), gate_says_stop=stop)
        self._publish()
        return events

    def _extend(self, extend: Any, stop: bool, charge: bool) -> bool:
        """More held-out prompts for a close decision, until it is decided or `extend` has no more to give."""
        monitor = self.gate_monitor
        while not stop and monitor.wants_more_evidence():
            got, seconds = extend(monitor.pair)
            if not got:
                break
            self.extensions += 1
            self.extra_eval_s += float(seconds)
            if charge and self.ledger is not None:
                self.ledger.charge(self.machine.run_id, self.machine.tenant, self.gpu_kind, "eval",
                                   float(seconds) * self.n_gpus)
            for step, scores in got.items():
                monitor.add_scores(float(step), scores)
            stop = bool(monitor.recheck())
        return stop

    def pause(self, step: int, reason: str) -> RunStatus | None:
        """A detector outside the supervisor (the platform scheduler's early-stop wrapper) says stop at checkpoint
        `step`: the run pauses there like a gate verdict. No-op unless the run is RUNNING or DEGRADED."""
        status = self.machine.on_checkpoint(int(step), gate_says_stop=True, gate_reason=reason)
        self._publish()
        return status

    def resume_after_pause(self, paused_step: int | None, reason: str, from_step: int) -> RunStatus:
        """Record that this run was paused at `paused_step` by `reason` and is resumed from the checkpoint at
        `from_step` (the replay of the steps up to `from_step` has been observed): PAUSED_BY_GATE(reason), then
        RUNNING. The gate detector starts afresh: it stops the run again only on evidence after the resume."""
        if self.machine.state is not RunState.PAUSED_BY_GATE:
            self.machine.transition(RunState.PAUSED_BY_GATE, reason, step=paused_step)
        self.pauses.append((paused_step, reason, int(from_step)))
        if self.gate_detector is not None:
            self.gate_monitor = self.gate_detector.start()
        self.machine.pending_pause = ""
        status = self.machine.resume()
        self._publish()
        return status

    def failing(self) -> str:
        """The reason this run will end FAILED whatever it does next, or "" while it may still succeed: the
        attribution (`eval.attribution.attribute`, the same function `finish` asks) of the paging alerts seen so far,
        as if the run completed now. A paging alert fails a run (non-convergence, or a platform fault for a
        run-mechanics alert) whatever the steps after it do, so the job's lifecycle stops there rather than spend
        its slots on a run that can only fail (`training.job.lifecycle.supervise`)."""
        if not self.machine.pages:
            return ""
        from eval.attribution import RunEvidence, attribute

        verdict = attribute(RunEvidence(completed=True, alerts=self.machine.pages, pauses=tuple(self.pauses)))
        return verdict.reason if verdict.failure_class is not None else ""

    def finish(
        self, completed: bool = True, exception: BaseException | None = None, reward_errors: Any = None,
        tenant_code: tuple[str, ...] = (), keep_paused: bool = False, kept: Any = True,
    ) -> RunStatus:
        """Attribute the run (eval.attribution) and move it to its terminal state. `keep_paused` (the live paths,
        where a paused run can be resumed): a run the gate paused, with no fault, stays PAUSED_BY_GATE instead of
        ending SUCCEEDED; its attribution says so. `kept`: the step of the best checkpoint kept (None: none was
        saved, and the reason says so rather than name one; True: the caller did not say, a checkpoint is assumed)."""
        from eval.attribution import Attribution, RunEvidence, attribute

        evidence = RunEvidence(completed=completed, exception=exception, reward_errors=reward_errors,
                               alerts=self.machine.pages, tenant_code=tenant_code, pauses=tuple(self.pauses))
        self.attribution = attribute(evidence)
        if self.attribution.failure_class is None and self.machine.state is RunState.PAUSED_BY_GATE:
            status = self.machine.status
            if kept is None:
                saved = "no checkpoint was saved before it (checkpoint_every), so none is kept"
                then = "; a resumed run starts over" if keep_paused else ""
            else:
                saved = "the best checkpoint" + ("" if kept is True else f" (step {kept})") + " is kept"
                then = "; resume the run to continue from it" if keep_paused else ""
            if keep_paused:
                self.attribution = Attribution(
                    None, f"paused at step {status.step} by the eval gate ({status.reason}); {saved}{then}",
                    self.attribution.examples)
                self._publish()
                return status
            self.attribution = Attribution(
                None, f"stopped early at step {status.step} by the eval gate ({status.reason}); {saved}",
                self.attribution.examples,
            )
        status = self.machine.finish(self.attribution, step=self.steps)
        self._publish()
        return status
