"""The sweep runner: Optuna samples the settings, each trial trains as a job on the sweep's GPU slots, the
platform's detector prunes trials that over-optimise, the budget stops new trials. Prefect-, MLflow- and CLI-free:
the CLI and the Prefect flow (`flows/sweep.py`) drive the same `SweepRunner` and plug MLflow in as a tracker.

    spec = load_spec("configs/sweeps/example.yaml")
    result = SweepRunner(spec, prune=True, resume=False).run()

Crash safety: the study lives in Optuna's storage (a SQLite file by default, a database URL when configured), and
every finished trial is told to it before anything else is recorded. A sweep killed mid-way is continued with
`resume=True`: finished trials (COMPLETE, PRUNED, FAIL) are never run again; a trial the dead process left RUNNING is
marked FAIL with the user attribute `interrupted` and its setting is queued again, so the study still ends with
`trials` finished trials that were not interrupted.

Trial order: the runner asks Optuna for trials ahead of the free slots (`spec.lookahead`: `queue_depth`) and queues
each on a `scheduling.live.LiveRound`, the placement object of the live platform round, with the spec's `scheduler`
(a `scheduling.policies` base policy) ranking them by a `JobView` (ask order as arrival, estimated rollout tokens as
duration); freed slots go to the trial it places first. Asked trials are RUNNING in Optuna while they wait: the ones
still waiting when the sweep ends (budget, exception) are told FAIL with `never_started`, do not count, and their
settings are queued again (see `SweepRunner._release_queued`); a killed process leaves them RUNNING, which `resume`
requeues like any interrupted trial. The scheduler only places trials; stopping one at a checkpoint is the pruner's.

Trial execution is behind ONE function, `run_trial(request, observer, ...)`: each trial (and seed) is a
`training.job.request.JobRequest` (`sweeps.spec.trial_request`), checked and built like every other job
(`training.job.request.build`) and run through the job lifecycle (`training.job.lifecycle.run_job`).
"""

from __future__ import annotations

import math
import os
import shutil
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from common.errors import BadInput
from scheduling.jobview import JobView
from scheduling.live import LiveRound
from sweeps.spec import SweepSpec, scheduler_policy, trial_config, trial_request
from training.job.lifecycle import JobHooks

#: an observer sees each checkpoint (a step whose held-out gate ran) and may return a stop reason
Observer = Callable[[int, dict[str, Any]], "str | None"]

DONE_STATES = ("COMPLETE", "PRUNED", "FAIL")


@dataclass
class TrialOutcome:
    """What one job (one trial, one seed) ended with."""

    state: str  # completed | pruned | failed
    steps: int
    gpu_seconds: float
    wall_s: float
    best_step: int | None = None
    best_score: float = math.nan
    best_se: float = math.nan
    best_checkpoint: str | None = None
    stop_reason: str | None = None
    pruned_at: int | None = None
    error: str | None = None
    records: list[dict[str, Any]] = field(default_factory=list)
    scores: list[dict[str, Any]] = field(default_factory=list)


def run_trial(request, observer: Observer | None = None, *, checked: Any = None, ledger: Any = None,
              run_id: str = "trial") -> TrialOutcome:
    """Train one job (`request`, a `training.job.request.JobRequest`: `sweeps.spec.trial_request`; `checked`, its
    `checked()` result when the caller has it) through the platform's job lifecycle: `training.job.request.build` then
    `training.job.lifecycle.run_job`, the path every job takes. Its saved checkpoints are scored on held-out prompts and
    the best is kept. `observer(step, metrics)` is called at every checkpoint (a step whose gate ran; `metrics` is
    the step's `StepRecord.flat()`) and may return a stop reason: the job stops there and keeps its best
    checkpoint (state `pruned`). Every step is charged to `ledger` (duck-typed `infra.ledger.Ledger`) under
    `run_id` and the request's tenant by the job's supervisor.

    The job's supervisor runs no gate detector (the request names none) and an empty alert catalog: the sweep's
    pruner is the only thing that stops a trial, so the `--no-prune` baseline is not cut short by another rule (an
    alert that pauses a run would also end the observer's calls for the rest of the trial)."""
    from dataclasses import replace

    from transformers.utils import logging as hf_logging

    from eval.health import Catalog
    from training.job.lifecycle import run_job
    from training.job.request import build

    hf_logging.set_verbosity_error()  # loading a checkpoint's tied lm_head prints a load report per checkpoint
    out = request.out_dir
    shutil.rmtree(out, ignore_errors=True)  # a trial's directory is its own: a re-run starts over
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    gpus = request.gpus
    try:
        checked = replace(checked if checked is not None else request.checked(), catalog=Catalog({}))
        spec, supervisor = build(request, checked, run_id=run_id, ledger=ledger, pausable=False)
        outcome = run_job(spec, observer, hooks=_TrialHooks(), supervisor=supervisor, observer_role="pruner")
    except Exception as err:  # noqa: BLE001 - a worker that cannot start ends the trial FAILED, recorded, not lost
        return TrialOutcome(state="failed", steps=0, gpu_seconds=0.0, wall_s=time.perf_counter() - t0,
                            error=f"{type(err).__name__}: {err}")
    records, scores = outcome.records, outcome.scores
    gpu_s = sum(v for r in records for k, v in r.items() if k.startswith("phase_") and k.endswith("_s")) * gpus
    state, error, pruned_at = "completed", None, None
    if outcome.decision == "failed":
        state, error = "failed", (f"{type(outcome.error).__name__}: {outcome.error}" if outcome.error is not None
                                  else outcome.status.reason)
    elif outcome.decision == "stopped":
        state, pruned_at = "pruned", int(records[-1]["step"]) if records else None
    if state != "failed" and scores and not any(math.isfinite(s["eval_score"]) for s in scores):
        state, error = "failed", f"scoring: no checkpoint could be scored ({scores[-1].get('error')})"
    best = outcome.best
    for s in scores:  # keep the best checkpoint only: a sweep saves dozens of runs
        if best is None or s["checkpoint"] != best["checkpoint"]:
            shutil.rmtree(s["checkpoint"], ignore_errors=True)
    return TrialOutcome(state=state, steps=len(records), gpu_seconds=gpu_s, wall_s=time.perf_counter() - t0,
                        best_step=best["step"] if best else None,
                        best_score=best["eval_score"] if best else math.nan,
                        best_se=best["eval_se"] if best else math.nan,
                        best_checkpoint=best["checkpoint"] if best else None, stop_reason=outcome.stop_reason or None,
                        pruned_at=pruned_at, error=error, records=records, scores=scores)


#: one checkpoint scored at a time in this process: transformers' `from_pretrained` is not thread-safe (two trial
#: threads loading checkpoints at once get corrupted weights and score them at -2 or NaN, so a trial silently kept
#: an earlier checkpoint, and its kept score moved with how the two trials' scoring overlapped)
_SCORE_LOCK = threading.Lock()


class _TrialHooks(JobHooks):
    """The lifecycle's in-process hooks, except that a checkpoint which cannot be scored (diverged weights) is
    skipped rather than failing the trial: a sweep explores settings that diverge; and checkpoints are scored one at
    a time across the sweep's trial threads (`_SCORE_LOCK`). (The worker is the lifecycle's own: `run_trial` empties
    the trial's directory first, so it starts fresh.)"""

    def score(self, spec, checkpoints):
        from training.job.lifecycle import step_of

        out = []
        for ckpt in checkpoints:
            try:
                with _SCORE_LOCK:
                    out += super().score(spec, [ckpt])
            except Exception as err:  # noqa: BLE001 - a diverged checkpoint (NaN weights) cannot be kept: skip it
                out.append({"checkpoint": ckpt, "step": step_of(ckpt), "eval_score": math.nan,
                            "eval_se": math.nan, "error": f"{type(err).__name__}: {err}"})
        return out


@dataclass
class TrialResult:
    """One trial of the sweep (all its seeds), as recorded in the study and reported."""

    number: int
    params: dict[str, Any]
    state: str  # completed | pruned | failed
    objective: float = math.nan
    objective_se: float = math.nan
    best_step: int | None = None
    best_checkpoint: str | None = None
    pruned_at: int | None = None
    stop_reason: str | None = None
    error: str | None = None
    gpu_seconds: float = 0.0
    wall_s: float = 0.0
    steps: int = 0
    run_id: str | None = None
    curve: list[tuple[int, float]] = field(default_factory=list)  # (step, held-out gate score)

    def attrs(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("number")
        d.pop("params")
        return {f"result.{k}": v for k, v in d.items()}

    @classmethod
    def from_frozen(cls, t) -> TrialResult | None:
        a = {k[len("result."):]: v for k, v in t.user_attrs.items() if k.startswith("result.")}
        if not a:
            return None
        a["curve"] = [tuple(p) for p in a.get("curve") or []]
        return cls(number=t.number, params=dict(t.params), **a)


class NullTracker:
    """The tracker interface (`tasks/sweep.py` implements it on MLflow); this one records nothing."""

    def start(self, spec: SweepSpec, resume: bool) -> None: ...

    def trial_started(self, number: int, params: dict[str, Any]) -> str | None:
        return None

    def trial_finished(self, result: TrialResult, records: list[dict[str, Any]]) -> None: ...

    def finish(self, summary: dict[str, Any], report_files: list[Path], failed: bool = False) -> dict[str, Any]:
        return {}


def make_sampler(spec: SweepSpec):
    import optuna

    class AskTellGridSampler(optuna.samplers.GridSampler):
        def after_trial(self, study, trial, state, values) -> None:
            # GridSampler calls study.stop() once the grid is covered, which Optuna allows only inside
            # study.optimize(); the runner asks and tells itself and stops at its own trial count
            pass

    s = spec.sampler
    if s.kind == "grid":
        return AskTellGridSampler({k: p.candidates() for k, p in spec.space.items()}, seed=s.seed)
    if s.kind == "random":
        return optuna.samplers.RandomSampler(seed=s.seed)
    return optuna.samplers.TPESampler(seed=s.seed, n_startup_trials=s.startup_trials, constant_liar=True)


def distributions(spec: SweepSpec) -> dict[str, Any]:
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    out: dict[str, Any] = {}
    for path, p in spec.space.items():
        kind = p.kind
        if kind in ("grid", "choice"):
            out[path] = CategoricalDistribution(p.candidates())
        else:
            low, high = getattr(p, kind)
            log = kind == "log_uniform"
            if isinstance(low, int) and isinstance(high, int):
                out[path] = IntDistribution(low, high, log=log)
            else:
                out[path] = FloatDistribution(float(low), float(high), log=log)
    return out


def make_pruner(spec: SweepSpec, prune: bool):
    """The spec's pruner (`eval.sweep_pruners`: incumbent, median, wilcoxon, none or a detector's name)."""
    from eval.sweep_pruners import make_pruner as named

    return named("none" if not prune else spec.pruning.detector, spec.pruning.params)


def gate_scores(out_dir: Path | None, step: int) -> dict[str, float]:
    """The per-prompt gold scores the trainer's gate recorded at `step` in the trial's run directory
    (`gate_records.csv`, common random numbers: the run's fixed sampling seed), {prompt id: score}."""
    from training.gate import GATE_RECORDS, read_records

    path = Path(out_dir) / GATE_RECORDS if out_dir is not None else None
    if path is None or not path.is_file():
        return {}
    return {r["prompt_id"]: float(r["gold_score"]) for r in read_records(path) if int(r["step"]) == int(step)}


def check_pruning(spec: SweepSpec) -> None:
    """The pruning detector must exist and take its params (checked before anything starts)."""
    try:
        make_pruner(spec, True)
    except ValueError as err:
        raise BadInput(f"pruning.detector: {err}") from None


def _owner() -> dict[str, Any]:
    import psutil

    return {"host": socket.gethostname(), "pid": os.getpid(), "start": psutil.Process().create_time()}


def _owner_alive(owner: dict[str, Any] | None) -> bool:
    import psutil

    if not owner or owner.get("host") != socket.gethostname():
        return False
    try:
        return abs(psutil.Process(int(owner["pid"])).create_time() - float(owner["start"])) < 1e-3
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, KeyError, TypeError, ValueError):
        return False


def open_study(spec: SweepSpec, prune: bool, resume: bool):
    """Create the sweep's study, or (resume) load it and recover the trials a dead process left RUNNING."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    url = spec.storage_url
    if url.startswith("sqlite:///"):
        Path(url[len("sqlite:///"):]).parent.mkdir(parents=True, exist_ok=True)
    kwargs = {"connect_args": {"timeout": 60}} if url.startswith("sqlite") else {}
    try:
        storage = optuna.storages.RDBStorage(url, engine_kwargs=kwargs)
    except Exception as err:  # noqa: BLE001 - a bad URL or an unreachable database is the user's to fix
        raise BadInput(f"storage: cannot open '{url}' ({type(err).__name__}: {str(err).splitlines()[0]})") from None
    direction = spec.objective.direction
    existing = {s.study_name for s in optuna.get_all_study_summaries(storage)}
    if spec.name in existing and not resume:
        study = optuna.load_study(study_name=spec.name, storage=storage)
        if study.trials:
            raise BadInput(f"name: sweep '{spec.name}' already has {len(study.trials)} trials in {url} (pass --resume "
                           "to continue or extend it, or give the sweep another name)")
    study = optuna.create_study(study_name=spec.name, storage=storage, sampler=make_sampler(spec),
                                pruner=make_pruner(spec, prune), direction=direction, load_if_exists=True)
    owner = study.user_attrs.get("owner")
    if resume and _owner_alive(owner) and owner.get("pid") != os.getpid():
        raise BadInput(f"name: sweep '{spec.name}' is being run by process {owner['pid']} (wait for it or stop it)")
    study.set_user_attr("owner", _owner())
    if resume:
        import optuna.trial as ot

        for t in study.get_trials(deepcopy=False, states=(ot.TrialState.RUNNING,)):
            study._storage.set_trial_user_attr(t._trial_id, "interrupted", True)
            study.tell(t.number, state=ot.TrialState.FAIL)
            study.enqueue_trial(dict(t.params), user_attrs={"requeued_from": t.number})
    return study


def finished(study) -> list:
    """Trials that count towards `trials`: COMPLETE, PRUNED, or FAIL that was neither an interruption nor a trial
    asked ahead that never started."""
    return [t for t in study.get_trials(deepcopy=False) if t.state.name in DONE_STATES
            and not t.user_attrs.get("interrupted") and not t.user_attrs.get("never_started")]


def estimated_work(spec: SweepSpec, params: dict[str, Any], base_dir: Path | None = None) -> float:
    """A trial's size as the scheduler's duration estimate: the rollout tokens its seeds will generate (seeds x
    steps x prompts per step x new tokens per prompt), what a PPO step's time grows with; only the ratio between
    trials matters. A setting that makes no valid job estimates 0: started, it fails at once and frees its slot."""
    try:
        cfg = trial_config(spec, params, 0, base_dir)
    except BadInput:
        return 0.0
    return float(spec.seeds_per_trial * cfg.steps * cfg.ppo.batch_size * cfg.ppo.max_new_tokens)


class SweepRunner:
    """Runs a sweep spec to its trial count or budget. `on_event(kind, info)` hears progress: `trial_started`,
    `trial_finished`, `budget`, `done`. `trial_fn` is `run_trial` (tests may wrap it)."""

    def __init__(self, spec: SweepSpec, *, prune: bool = True, resume: bool = False, tracker: Any = None,
                 ledger: Any = None, on_event: Callable[[str, dict[str, Any]], None] | None = None,
                 trial_fn: Callable[..., TrialOutcome] = run_trial, base_dir: Path | None = None,
                 slot: Callable[[], Any] | None = None, report: bool = True) -> None:
        check_pruning(spec)
        self.spec, self.prune, self.resume = spec, prune and spec.pruning.detector.lower() != "none", resume
        self.tracker = tracker or NullTracker()
        self.ledger, self.trial_fn, self.base_dir = ledger, trial_fn, base_dir
        self.on_event = on_event or (lambda kind, info: None)
        self.slot = slot  # a context-manager factory holding the trial's GPU slots (the flow's Prefect pool)
        self.report = report
        self._lock = threading.RLock()  # Optuna storage calls from the trial threads and the main thread
        self._live_gpu_s: dict[int, float] = {}
        self._done_seeds_gpu_s: dict[int, float] = {}
        self.budget_stop: str | None = None

    # ---- budget --------------------------------------------------------------------------------------------
    def spent_gpu_seconds(self, study) -> float:
        done = sum(float(t.user_attrs.get("result.gpu_seconds", 0.0)) for t in study.get_trials(deepcopy=False))
        return done + sum(self._live_gpu_s.values())

    def _budget_reached(self, study, t0: float) -> str | None:
        b = self.spec.budget
        if b.gpu_hours is not None:
            spent = self.spent_gpu_seconds(study) / 3600
            if spent >= b.gpu_hours:
                return f"budget.gpu_hours reached: {spent:.4f} of {b.gpu_hours:g} GPU-hours spent"
        if b.wall_s is not None and time.time() - t0 >= b.wall_s:
            return f"budget.wall_s reached: {time.time() - t0:.0f} of {b.wall_s:g} s"
        return None

    # ---- one trial ----------------------------------------------------------------------------------------
    def _observer(self, trial, seed_index: int, steps: int, out_dir: Path | None = None,
                  looks: int | None = None) -> Observer:
        from eval.optuna_pruner import report_checkpoint
        from eval.sweep_pruners import stop_reason

        def observe(step: int, m: dict[str, Any]) -> str | None:
            global_step = seed_index * steps + step
            # what the running trial has spent so far, for the budget (the trainer's wall x the trial's GPUs)
            self._live_gpu_s[trial.number] = self._done_seeds_gpu_s.get(trial.number, 0.0) + float(
                m.get("wall_s", 0.0)) * self.spec.gpus_per_trial
            with self._lock:
                report_checkpoint(trial, global_step, m.get("gold_eval", math.nan), se=m.get("gold_eval_se", math.nan),
                                  reward=m.get("reward_mean", math.nan), series=seed_index,
                                  prompts=gate_scores(out_dir, step), planned_checkpoints=looks,
                                  keep="highest")  # the checkpoint run_trial keeps (best_of), in either direction
                if self.prune and trial.should_prune():
                    # the step Optuna knows the trial at (the trial's pruned_at), not the seed's own
                    return stop_reason(trial.study.pruner, trial.study, trial, global_step)
            return None

        return observe

    def _run_one(self, trial) -> tuple[TrialResult, list[dict[str, Any]]]:
        spec = self.spec
        params = dict(trial.params)
        res = TrialResult(number=trial.number, params=params, state="completed")
        records: list[dict[str, Any]] = []
        t0 = time.perf_counter()
        try:
            res.run_id = self.tracker.trial_started(trial.number, params)
        except Exception as err:  # noqa: BLE001
            res.state, res.error = "failed", f"tracking: {type(err).__name__}: {err}"
            return res, records
        outcomes = []
        slot = self.slot() if self.slot is not None else None
        entered = False
        try:
            if slot is not None:
                slot.__enter__()
                entered = True
            for i in range(spec.seeds_per_trial):
                request = trial_request(spec, params, trial.number, i, self.base_dir)
                checked = request.checked()  # the trial's config (and files) as every job checks them
                cfg = checked.config
                observer = self._observer(trial, i, cfg.steps, request.out_dir, cfg.steps // cfg.eval_every)
                o = self.trial_fn(request, observer, checked=checked, ledger=self.ledger,
                                  run_id=res.run_id or f"{spec.name}/trial-{trial.number}")
                outcomes.append(o)
                self._done_seeds_gpu_s[trial.number] = self._live_gpu_s[trial.number] = sum(
                    x.gpu_seconds for x in outcomes)
                offset = i * cfg.steps
                records += [{**r, "step": r["step"] + offset} for r in o.records]
                res.curve += [(int(r["step"]) + offset, float(r["gold_eval"])) for r in o.records
                              if math.isfinite(r.get("gold_eval", math.nan))]
                if o.state != "completed":
                    break
        except Exception as err:  # noqa: BLE001 - recorded FAILED in Optuna and MLflow, not lost
            res.state, res.error = "failed", f"{type(err).__name__}: {err}"
        finally:
            if entered:
                slot.__exit__(None, None, None)
        res.gpu_seconds = sum(o.gpu_seconds for o in outcomes)
        res.steps = sum(o.steps for o in outcomes)
        res.wall_s = time.perf_counter() - t0
        if outcomes and res.state != "failed":
            last = outcomes[-1]
            res.state = last.state
            res.error, res.stop_reason = last.error, last.stop_reason
            if last.pruned_at is not None:
                res.pruned_at = (len(outcomes) - 1) * (cfg.steps) + last.pruned_at
            scored = [o for o in outcomes if math.isfinite(o.best_score)]
            if scored and res.state != "failed":
                res.objective = sum(o.best_score for o in scored) / len(scored)
                ses = [o.best_se for o in scored]
                res.objective_se = math.sqrt(sum(s * s for s in ses)) / len(ses)
                top = max(scored, key=lambda o: o.best_score)
                res.best_step, res.best_checkpoint = top.best_step, top.best_checkpoint
        return res, records

    def _tell(self, study, trial, res: TrialResult) -> None:
        from optuna.trial import TrialState

        with self._lock:
            # a trial none of whose checkpoints scored failed: say so before the study records it
            if res.state == "completed" and not math.isfinite(res.objective):
                res.state, res.error = "failed", res.error or "no checkpoint scored"
            for k, v in res.attrs().items():
                trial.set_user_attr(k, v)
            if res.state == "failed":
                study.tell(trial, state=TrialState.FAIL)
            elif res.state == "pruned":
                study.tell(trial, state=TrialState.PRUNED)
            else:
                study.tell(trial, res.objective)

    # ---- the sweep ----------------------------------------------------------------------------------------
    def _view(self, trial, arrival: int) -> JobView:
        """What the scheduler sees of a queued trial: its GPUs, its place in the ask order, its estimated size."""
        return JobView(trial.number, "rlhf", 0, self.spec.gpus_per_trial, float(arrival),
                       estimated_work(self.spec, dict(trial.params), self.base_dir))

    def _release_queued(self, study, queued: dict[int, Any]) -> None:
        """Trials asked ahead that never started (the budget stopped the sweep, or it raised): told FAIL with the user
        attribute `never_started`, so they neither stay RUNNING nor count as finished, and their settings queued again
        (`requeued_from`) so a resumed or extended sweep tries them next, in the same order."""
        from optuna.trial import TrialState

        with self._lock:
            for trial in sorted(queued.values(), key=lambda t: t.number):
                trial.set_user_attr("never_started", True)
                study.tell(trial, state=TrialState.FAIL)
                study.enqueue_trial(dict(trial.params), user_attrs={"requeued_from": trial.number})
        queued.clear()

    def run(self, trials: int | None = None) -> dict[str, Any]:
        """Ask Optuna for trials ahead of the free slots (`spec.lookahead` more than fit), queue each on a
        `scheduling.live.LiveRound` with the spec's scheduler, start whichever it places when slots free."""
        spec = self.spec
        target = trials or spec.trials
        study = open_study(spec, self.prune, self.resume)
        dists = distributions(spec)
        self.tracker.start(spec, self.resume)
        t0 = time.time()
        session: list[TrialResult] = []
        live = LiveRound(scheduler_policy(spec.scheduler), [], [], slots=spec.concurrency)
        queued: dict[int, Any] = {}  # LiveRound index -> an asked trial waiting for a slot (RUNNING in Optuna)
        asked = 0
        self.start_order: list[int] = []
        failed_sweep = False
        try:
            with ThreadPoolExecutor(spec.parallel_trials, thread_name_prefix="trial") as pool:
                running: dict[Any, tuple[int, Any]] = {}
                while True:
                    with self._lock:
                        n_done = len(finished(study))
                    if (self.budget_stop is None and live.free >= spec.gpus_per_trial
                            and n_done + len(running) < target):
                        with self._lock:
                            self.budget_stop = self._budget_reached(study, t0)
                        if self.budget_stop:
                            self.on_event("budget", {"message": self.budget_stop, "done": n_done, "target": target})
                    if self.budget_stop is None:
                        # ask ahead: a trial for each free slot plus the lookahead, never more than the target needs
                        while (len(running) + len(queued) < spec.parallel_trials + spec.lookahead
                               and n_done + len(running) + len(queued) < target):
                            with self._lock:
                                trial = study.ask(dists)
                            queued[live.submit(self._view(trial, asked), spec.gpus_per_trial)] = trial
                            asked += 1
                            self.on_event("trial_queued", {"number": trial.number, "params": dict(trial.params)})
                        for i in live.to_start():
                            trial = queued.pop(i)
                            self.start_order.append(trial.number)
                            self.on_event("trial_started", {"number": trial.number, "params": dict(trial.params)})
                            running[pool.submit(self._run_one, trial)] = (i, trial)
                    if not running:
                        break
                    done, _ = wait(list(running), return_when=FIRST_COMPLETED)
                    for fut in done:
                        i, trial = running.pop(fut)
                        live.finished(i)
                        res, records = fut.result()
                        self._tell(study, trial, res)
                        self._live_gpu_s.pop(trial.number, None)
                        self._done_seeds_gpu_s.pop(trial.number, None)
                        session.append(res)
                        try:
                            self.tracker.trial_finished(res, records)
                        except Exception as err:  # noqa: BLE001 - the study has it; tracking is best effort here
                            self.on_event("warning", {"message": f"trial {res.number}: tracking failed: {err}"})
                        self.on_event("trial_finished", {"result": res, "running": len(running)})
        except BaseException:
            failed_sweep = True
            raise
        finally:
            try:
                self._release_queued(study, queued)
            except Exception as err:  # noqa: BLE001 - after a failure, do not hide it: --resume requeues them anyway
                if not failed_sweep:
                    raise
                self.on_event("warning", {"message": f"queued trials left RUNNING for --resume: {err}"})
            summary = self.summary(study, session, time.time() - t0, target)
            files = []
            if self.report and not failed_sweep:
                from sweeps.report import write_report

                files = write_report(summary, spec.run_dir / "report")
            summary["report_files"] = [str(p) for p in files]
            summary["registry"] = self.tracker.finish(summary, files, failed=failed_sweep)
        self.on_event("done", summary)
        return summary

    def summary(self, study, session: list[TrialResult], wall_s: float, target: int) -> dict[str, Any]:
        results = [r for r in (TrialResult.from_frozen(t) for t in finished(study)) if r is not None]
        results.sort(key=lambda r: r.number)
        sign = -1.0 if self.spec.objective.direction == "minimize" else 1.0
        scored = [r for r in results if math.isfinite(r.objective)]
        best = max(scored, key=lambda r: (sign * r.objective, -r.number)) if scored else None
        return {
            "name": self.spec.name, "tenant": self.spec.tenant, "storage": self.spec.storage_url,
            "direction": self.spec.objective.direction, "prune": self.prune,
            "pruner": self.spec.pruning.detector if self.prune else "none", "target_trials": target,
            "trials": [asdict(r) for r in results],
            "trials_done": len(results), "trials_pruned": sum(r.state == "pruned" for r in results),
            "trials_failed": sum(r.state == "failed" for r in results),
            "trials_this_session": len(session),
            "gpu_seconds": sum(r.gpu_seconds for r in results),
            "gpu_seconds_this_session": sum(r.gpu_seconds for r in session),
            "wall_s": wall_s, "budget_stop": self.budget_stop,
            "scheduler": self.spec.scheduler, "queue_depth": self.spec.lookahead,
            "start_order": list(getattr(self, "start_order", [])),
            "best": asdict(best) if best else None,
        }
