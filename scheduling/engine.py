"""Discrete-event engine: Poisson arrivals, slot-based GPU allocation, preemption, evaluations.

One job's life: it waits; when started it trains until its next scheduled checkpoint, then its
evaluation occupies the same GPUs for `eval_minutes`; when the eval lands the policy (and any early-stop
wrapper) sees it through the job's `JobView`, and the job stops, finishes (last checkpoint) or trains
on. A preempted job keeps the training it did, loses an eval in flight, and pays the preemption
overhead (checkpoint reload) when it resumes.

Allocation is slot-based: a job runs on exactly its GPU demand or waits. At every event the engine
starts the best-ranked waiting job that fits; if the best job does not fit, a preemptive policy evicts
running jobs that rank strictly worse (worst first) when that frees enough GPUs; otherwise smaller
queued jobs are backfilled into the free GPUs in rank order.

Why it is fast:
- Coalesced checkpoints. Most checkpoints change nothing outside their own job: the job trains on, and
  for the common policies its rank can only improve (SRTF-Est) or never changes (FIFO, SJF-Est), and
  the early-stop verdict depends on the job's own checkpoint series alone. For such policies
  (`Policy.rank_never_worsens` and `Policy.stop_reads_history_only`) the verdicts are replayed once
  per job, checkpoint by checkpoint (a monitor only ever sees checkpoints up to the one it judges),
  and a running job gets one heap event, where it ends. Its intermediate checkpoints land lazily:
  when it ends, or when the scheduler looks at it (eviction) or preempts it, the checkpoints whose
  evals landed by then are applied in order with exactly the arithmetic an event per checkpoint
  would have used, so results are identical to the eager engine (tested). Policies whose rank can
  worsen at a checkpoint (LossAware, EvalSched) get one event per checkpoint, as before.
- Flat per-job state in typed arrays (`array.array`): no Python object per field, a fraction of the
  memory of lists of floats, and one cache line where a list would need two.
- Arrivals are pre-sorted and merged with the event heap instead of pushed into it; waiting jobs sit in
  one heap per GPU demand, so "best job that fits in g free GPUs" costs a look at a handful of heap
  tops; stale heap entries are dropped lazily (version counters), and the running heap is compacted
  when stale entries outnumber live ones.
"""

from __future__ import annotations

import heapq
from array import array
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from scheduling.jobview import CheckpointSeries, JobView
from scheduling.policies import Policy
from scheduling.workload import JOB_TYPES, Workload

PENDING, WAITING, RUNNING, DONE = 0, 1, 2, 3
NEG_INF = float("-inf")
NAN = float("nan")


@dataclass
class SimResult:
    """Per-job outcome arrays (index = job id) plus run-level counters."""

    end: np.ndarray  # completion or stop time (minutes)
    stopped: np.ndarray  # bool: the early-stop wrapper stopped it (at its last checkpoint included)
    stop_progress: np.ndarray  # progress of the checkpoint it ended at
    busy: np.ndarray  # minutes it held its GPUs (training, evals, restart overhead)
    busy_at_useful: np.ndarray  # `busy` when its last useful checkpoint landed
    first_useful: np.ndarray  # time of its first useful checkpoint, NaN if none
    best_eval: np.ndarray
    best_index: np.ndarray  # flat checkpoint index of the best eval at or before the end
    end_index: np.ndarray  # flat checkpoint index the job ended at
    final_eval: np.ndarray  # eval of the checkpoint it ended at
    saved_minutes: np.ndarray  # training + eval minutes avoided by stopping early (per GPU)
    preemptions: np.ndarray
    events: int  # arrivals + checkpoint landings (each counted once, coalesced or not)
    makespan: float  # time the last job ended


def simulate(
    wl: Workload,
    policy: Policy,
    gpus: int,
    overhead: float = 2.0,
    quality_threshold: float = 0.3,
    min_improvement: float = 0.01,
    backfill: bool = True,
    progress: Callable[[int], None] | None = None,
    coalesce: bool = True,
) -> SimResult:
    """Run `policy` over the workload on `gpus` GPUs. `coalesce=False` forces one event per checkpoint
    for every policy (the reference the coalesced path is tested against)."""
    n = wl.n
    if n and int(wl.gpus.max()) > gpus:
        raise ValueError(f"a job needs {int(wl.gpus.max())} GPUs but the cluster has {gpus}")
    arrival = wl.arrival.tolist()  # read once per job, in order
    jtype = wl.job_type.tolist()
    tenant = wl.tenant.tolist()
    demand = _typed("q", wl.gpus)
    duration = _typed("d", wl.duration)
    eval_min = _typed("d", wl.eval_minutes)
    est = _typed("d", wl.est_duration)
    eval_se = _typed("d", wl.eval_se)
    cp_start = _typed("q", wl.cp_start)
    cp_prog = _typed("d", wl.cp_progress)
    cp_eval = _typed("d", wl.cp_eval)
    cp_loss = _typed("d", wl.cp_loss)
    cp_reward = _typed("d", wl.cp_reward)

    preemptive = policy.preemptive
    priority = policy.priority
    on_checkpoint = policy.on_checkpoint
    forget = policy.forget
    # Coalesce checkpoints when no checkpoint of a running job can matter to anyone else before it ends.
    lazy = coalesce and policy.stop_reads_history_only and (not preemptive or policy.rank_never_worsens)
    thr, imp = quality_threshold, min_improvement
    heappush, heappop = heapq.heappush, heapq.heappop

    state = array("b", bytes(n))  # PENDING
    token = _filled("q", n, 0)  # validity of the job's pending heap event
    wver = _filled("q", n, 0)  # validity of waiting-heap entries
    rver = _filled("q", n, 0)  # validity of running-heap entries
    prio = _filled("d", n, 0.0)
    views: list[JobView | None] = [None] * n
    next_k = _filled("q", n, 0)  # flat index of the job's next checkpoint
    end_k = _typed("q", wl.cp_start[1:] - 1)  # flat index the job ends at (lazy: planned; else its last, until it ends)
    stop_k = _filled("q", n, -1)  # lazy: flat index where the policy's replayed verdict says stop, -1 never
    next_land = _filled("d", n, 0.0)  # lazy: when the next checkpoint's eval lands if the job keeps running
    attained = _filled("d", n, 0.0)
    run_start = _filled("d", n, 0.0)  # start of the current segment (start, resume or last checkpoint)
    seg_over = _filled("d", n, 0.0)  # restart overhead paid at the start of the segment
    seg_train = _filled("d", n, 0.0)  # training minutes in the segment before its eval
    busy = _filled("d", n, 0.0)
    busy_useful = _filled("d", n, 0.0)
    first_useful = _filled("d", n, NAN)
    best = _filled("d", n, NEG_INF)
    n_preempt = _filled("q", n, 0)
    best_k = _filled("q", n, 0)  # flat checkpoint index of the best eval so far (the checkpoint a stop keeps)
    end = _filled("d", n, 0.0)
    stopped = array("b", bytes(n))
    stop_prog = _filled("d", n, 0.0)
    final_eval = _filled("d", n, NAN)
    saved = _filled("d", n, 0.0)

    plan = None
    if lazy:
        plan = policy.plan_stops(CheckpointSeries(
            job_type=wl.job_type, cp_start=wl.cp_start, progress=wl.cp_progress, eval_score=wl.cp_eval,
            loss=wl.cp_loss, reward=wl.cp_reward, eval_se=wl.eval_se), JOB_TYPES)
    if plan is not None:
        stop_k = _typed("q", plan)
        end_k = _typed("q", np.where(plan >= 0, plan, wl.cp_start[1:] - 1))

    events: list[tuple[float, int, int]] = []  # (time, job, token)
    # waiting jobs: one heap per GPU demand -> (priority, job, version)
    sizes = sorted(set(wl.gpus.tolist()))
    waiting: dict[int, list[tuple[float, int, int]]] = {g: [] for g in sizes}
    running: list[tuple[float, int, int]] = []  # (-priority, job, version), preemptive policies only
    free = gpus
    n_waiting = n_running = 0
    n_events = 0
    n_done = 0
    makespan = 0.0
    tick = max(n // 100, 1)

    def plan_stop(i: int) -> None:
        """Replay the policy's checkpoint verdicts for job i, one checkpoint at a time, on a view of
        its own: the first checkpoint it would stop at (if any) is where the job will end. (For
        policies without a batch `plan_stops`.)"""
        v = JobView(i, JOB_TYPES[jtype[i]], tenant[i], demand[i], arrival[i], est[i])
        v.eval_se = eval_se[i]
        for k in range(cp_start[i], end_k[i] + 1):
            p = cp_prog[k]
            v.attained = p * duration[i]
            v.progress = p
            v.eval_history.append(cp_eval[k])
            v.loss_history.append(cp_loss[k])
            v.reward_history.append(cp_reward[k])
            v.progress_history.append(p)
            if on_checkpoint(v):
                stop_k[i] = end_k[i] = k
                break
        forget(i)

    def push_waiting(i: int) -> None:
        nonlocal n_waiting
        state[i] = WAITING
        n_waiting += 1
        wver[i] += 1
        heappush(waiting[demand[i]], (prio[i], i, wver[i]))

    def start(i: int, t: float) -> None:
        nonlocal free, n_waiting, n_running
        state[i] = RUNNING
        n_waiting -= 1
        n_running += 1
        free -= demand[i]
        k = next_k[i]
        over = overhead if n_preempt[i] else 0.0
        train = cp_prog[k] * duration[i] - attained[i]
        if train < 0.0:
            train = 0.0
        run_start[i] = t
        seg_over[i] = over
        seg_train[i] = train
        token[i] += 1
        at = t + over + train + eval_min[i]
        if lazy:
            next_land[i] = at
            # chain the later checkpoints with the same arithmetic their own events would use
            dur, ev = duration[i], eval_min[i]
            for j in range(k, end_k[i]):
                at = at + (cp_prog[j + 1] - cp_prog[j]) * dur + ev
        heappush(events, (at, i, token[i]))
        if preemptive:
            rver[i] += 1
            heappush(running, (-prio[i], i, rver[i]))
            if len(running) > 2 * n_running + 64:
                # drop entries of jobs that stopped running; the order of live entries is unchanged
                running[:] = [e for e in running if state[e[1]] == RUNNING and rver[e[1]] == e[2]]
                heapq.heapify(running)

    def land(i: int, t: float, view: JobView | None) -> int:
        """The eval of job i's next checkpoint lands at time t: account for it. Returns its flat index."""
        nonlocal n_events
        n_events += 1
        k = next_k[i]
        p = cp_prog[k]
        e = cp_eval[k]
        busy[i] += t - run_start[i]
        attained[i] = p * duration[i]
        if view is not None:
            view.attained = attained[i]
            view.progress = p
            view.eval_history.append(e)
            view.loss_history.append(cp_loss[k])
            view.reward_history.append(cp_reward[k])
            view.progress_history.append(p)
        b = best[i]
        # useful: clears the quality bar and beats the previous best by the minimum relative gain
        if e >= thr and (b == NEG_INF or e >= b + imp * abs(b)):
            busy_useful[i] = busy[i]
            if first_useful[i] != first_useful[i]:
                first_useful[i] = t
        if e > b:
            best[i] = e
            best_k[i] = k
        return k

    def train_on(i: int, k: int, t: float) -> None:
        """Job i keeps its GPUs after checkpoint k (landed at t) and trains towards checkpoint k + 1."""
        next_k[i] = k + 1
        run_start[i] = t
        seg_over[i] = 0.0
        seg_train[i] = (cp_prog[k + 1] - cp_prog[k]) * duration[i]

    def catch_up(i: int, t: float, view: JobView | None) -> None:
        """Lazy mode: apply the checkpoints of running job i whose evals landed by time t (not its
        final one, which is its own event), so its state and `view` are what per-checkpoint events
        would have left."""
        while next_land[i] <= t and next_k[i] < end_k[i]:
            at = next_land[i]
            k = land(i, at, view)
            train_on(i, k, at)
            next_land[i] = at + seg_train[i] + eval_min[i]

    def finish(i: int, k: int, t: float, stop: bool) -> None:
        nonlocal free, n_running, n_done, makespan
        state[i] = DONE
        n_running -= 1
        free += demand[i]
        end[i] = t
        makespan = t
        stopped[i] = stop
        stop_prog[i] = cp_prog[k]
        end_k[i] = k
        final_eval[i] = cp_eval[k]
        last = cp_start[i + 1] - 1
        if k != last:
            saved[i] = (1.0 - cp_prog[k]) * duration[i] + (last - k) * eval_min[i]
        forget(i)
        views[i] = None  # histories are no longer needed: keep memory flat on huge runs
        n_done += 1
        if progress is not None and n_done % tick == 0:
            progress(n_done)

    def preempt(i: int, t: float) -> None:
        nonlocal free, n_running
        elapsed = t - run_start[i]
        busy[i] += elapsed
        done = elapsed - seg_over[i]
        if done > 0.0:
            attained[i] += done if done < seg_train[i] else seg_train[i]
        token[i] += 1
        free += demand[i]
        n_running -= 1
        v = views[i]
        v.attained = attained[i]
        v.preemptions += 1
        n_preempt[i] += 1
        prio[i] = priority(v)
        push_waiting(i)

    def schedule(t: float) -> None:
        while n_waiting:
            # best waiting job overall, and best that fits in the free GPUs
            head = head_g = fit = fit_g = None
            for g in sizes:
                h = waiting[g]
                e = None
                while h:  # drop stale entries (inlined: this is the hottest loop)
                    e = h[0]
                    j = e[1]
                    if state[j] == WAITING and wver[j] == e[2]:
                        break
                    heappop(h)
                    e = None
                if e is None:
                    continue
                if head is None or e < head:
                    head, head_g = e, g
                if g <= free and (fit is None or e < fit):
                    fit, fit_g = e, g
            if head_g <= free:
                heappop(waiting[head_g])
                start(head[1], t)
                continue
            if preemptive and running:
                need = head_g - free
                hp = head[0]
                victims = []
                got = 0
                while running and got < need:
                    negp, j, ver = running[0]
                    if state[j] != RUNNING or rver[j] != ver:
                        heappop(running)
                        continue
                    if -negp <= hp:
                        break  # every remaining runner ranks at least as well as the head
                    # Its key dates from its last checkpoint; refresh it with the service received
                    # since (attained service is observable) before deciding to evict it.
                    if lazy:
                        catch_up(j, t, views[j])
                    vj = views[j]
                    live = t - run_start[j] - seg_over[j]
                    vj.attained = attained[j] + (0.0 if live < 0.0 else min(live, seg_train[j]))
                    now_p = priority(vj)
                    if now_p != -negp:
                        prio[j] = now_p
                        rver[j] += 1
                        heapq.heapreplace(running, (-now_p, j, rver[j]))
                        continue
                    heappop(running)
                    victims.append((negp, j, ver))
                    got += demand[j]
                if got >= need:
                    heappop(waiting[head_g])  # still the top: nothing was pushed since `top`
                    for _, j, _ in victims:
                        preempt(j, t)
                    start(head[1], t)
                    continue
                for entry in victims:
                    heappush(running, entry)
            if backfill and fit is not None:
                heappop(waiting[fit_g])
                start(fit[1], t)
                continue
            return

    next_arrival = 0
    while True:
        if next_arrival < n and (not events or arrival[next_arrival] < events[0][0]):
            i = next_arrival
            next_arrival += 1
            t = arrival[i]
            v = JobView(i, JOB_TYPES[jtype[i]], tenant[i], demand[i], t, est[i])
            v.eval_se = eval_se[i]
            views[i] = v
            next_k[i] = cp_start[i]
            if lazy and plan is None:
                plan_stop(i)
            prio[i] = priority(v)
            push_waiting(i)
            n_events += 1
            # After every scheduling pass no waiting job fits and no eviction is possible, and since
            # then running jobs only ranked better. So only the newcomer can change anything: if it
            # fits, or if some runner ranks worse than it (a stale heap key errs towards a pass).
            if demand[i] <= free or (preemptive and running and -running[0][0] > prio[i]):
                schedule(t)
            continue
        if not events:
            break
        t, i, tok = heappop(events)
        if tok != token[i]:
            continue
        if lazy:
            # job i ends here: apply its remaining checkpoints in order, the last one landing now
            # (the view is dropped when the job ends, so these landings skip it)
            catch_up(i, t, None)
            k = land(i, next_land[i], None)
            finish(i, k, t, stop_k[i] == k)
            schedule(t)
            continue
        # eager: one event per checkpoint
        v = views[i]
        k = land(i, t, v)
        last = k == cp_start[i + 1] - 1
        stop = on_checkpoint(v)
        if stop or last:
            finish(i, k, t, stop)
            schedule(t)
            continue
        # train on to the next checkpoint without leaving the GPUs
        train_on(i, k, t)
        token[i] += 1
        heappush(events, (t + seg_train[i] + eval_min[i], i, token[i]))
        if preemptive:
            new = priority(v)
            if new > prio[i]:
                # It ranks worse now: it may have become a victim for a waiting job.
                prio[i] = new
                rver[i] += 1
                heappush(running, (-new, i, rver[i]))
                schedule(t)
            elif new < prio[i]:
                # Ranking better changes nothing for waiting jobs; its running-heap key is refreshed
                # lazily if it is ever considered for eviction.
                prio[i] = new

    return SimResult(
        end=np.frombuffer(end),
        stopped=np.frombuffer(stopped, dtype=np.int8).astype(bool),
        stop_progress=np.frombuffer(stop_prog),
        busy=np.frombuffer(busy),
        busy_at_useful=np.frombuffer(busy_useful),
        first_useful=np.frombuffer(first_useful),
        best_eval=np.frombuffer(best),
        best_index=np.frombuffer(best_k, dtype=np.int64),
        end_index=np.frombuffer(end_k, dtype=np.int64),
        final_eval=np.frombuffer(final_eval),
        saved_minutes=np.frombuffer(saved),
        preemptions=np.frombuffer(n_preempt, dtype=np.int64),
        events=n_events,
        makespan=makespan,
    )


def _typed(code: str, values: np.ndarray) -> array:
    """A numpy column as a typed array ('d': float64, 'q': int64)."""
    out = array(code)
    out.frombytes(np.ascontiguousarray(values, dtype=np.float64 if code == "d" else np.int64).tobytes())
    return out


def _filled(code: str, n: int, value: float) -> array:
    return array(code, [value]) * n
