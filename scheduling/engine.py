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

Why it is fast: arrivals are pre-sorted and merged with the event heap instead of pushed into it;
waiting jobs sit in one heap per GPU demand, so "best job that fits in g free GPUs" costs a look at a
handful of heap tops rather than a queue scan; stale heap entries are dropped lazily (version
counters) rather than searched for; per-job state lives in flat Python lists, not objects.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from scheduling.jobview import JobView
from scheduling.policies import Policy
from scheduling.workload import JOB_TYPES, Workload

PENDING, WAITING, RUNNING, DONE = 0, 1, 2, 3
NEG_INF = float("-inf")


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
    events: int
    makespan: float


def simulate(
    wl: Workload,
    policy: Policy,
    gpus: int,
    overhead: float = 2.0,
    quality_threshold: float = 0.3,
    min_improvement: float = 0.01,
    backfill: bool = True,
    progress: Callable[[int], None] | None = None,
) -> SimResult:
    n = wl.n
    arrival = wl.arrival.tolist()
    demand = wl.gpus.tolist()
    duration = wl.duration.tolist()
    eval_min = wl.eval_minutes.tolist()
    est = wl.est_duration.tolist()
    jtype = wl.job_type.tolist()
    tenant = wl.tenant.tolist()
    cp_start = wl.cp_start.tolist()
    cp_prog = wl.cp_progress.tolist()
    cp_eval = wl.cp_eval.tolist()
    cp_loss = wl.cp_loss.tolist()
    cp_reward = wl.cp_reward.tolist()
    eval_se = wl.eval_se.tolist()
    if max(demand, default=0) > gpus:
        raise ValueError(f"a job needs {max(demand)} GPUs but the cluster has {gpus}")

    preemptive = policy.preemptive
    priority = policy.priority
    on_checkpoint = policy.on_checkpoint
    forget = policy.forget
    thr, imp = quality_threshold, min_improvement
    heappush, heappop = heapq.heappush, heapq.heappop

    state = [PENDING] * n
    token = [0] * n  # validity of the job's pending checkpoint event
    wver = [0] * n  # validity of waiting-heap entries
    rver = [0] * n  # validity of running-heap entries
    prio = [0.0] * n
    views: list[JobView | None] = [None] * n
    next_cp = [0] * n
    attained = [0.0] * n
    run_start = [0.0] * n
    seg_over = [0.0] * n
    seg_train = [0.0] * n
    busy = [0.0] * n
    busy_useful = [0.0] * n
    first_useful = [float("nan")] * n
    best = [float("-inf")] * n
    n_preempt = [0] * n
    best_k = [0] * n  # flat checkpoint index of the best eval so far (the checkpoint a stop keeps)
    end_k = [0] * n  # flat checkpoint index the job ended at
    end = [0.0] * n
    stopped = [False] * n
    stop_prog = [0.0] * n
    final_eval = [float("nan")] * n
    saved = [0.0] * n

    events: list[tuple[float, int, int]] = []  # (time, job, token)
    # waiting jobs: one heap per GPU demand -> (priority, job, version)
    sizes = sorted(set(demand))
    waiting: dict[int, list[tuple[float, int, int]]] = {g: [] for g in sizes}
    running: list[tuple[float, int, int]] = []  # (-priority, job, version), preemptive policies only
    free = gpus
    n_events = 0
    n_done = 0
    tick = max(n // 100, 1)

    def push_waiting(i: int) -> None:
        state[i] = WAITING
        wver[i] += 1
        heappush(waiting[demand[i]], (prio[i], i, wver[i]))

    def start(i: int, t: float) -> None:
        nonlocal free
        state[i] = RUNNING
        free -= demand[i]
        c = next_cp[i]
        over = overhead if n_preempt[i] else 0.0
        train = cp_prog[cp_start[i] + c] * duration[i] - attained[i]
        if train < 0.0:
            train = 0.0
        run_start[i] = t
        seg_over[i] = over
        seg_train[i] = train
        token[i] += 1
        heappush(events, (t + over + train + eval_min[i], i, token[i]))
        if preemptive:
            rver[i] += 1
            heappush(running, (-prio[i], i, rver[i]))

    def preempt(i: int, t: float) -> None:
        nonlocal free
        elapsed = t - run_start[i]
        busy[i] += elapsed
        done = elapsed - seg_over[i]
        if done > 0.0:
            attained[i] += done if done < seg_train[i] else seg_train[i]
        token[i] += 1
        free += demand[i]
        v = views[i]
        v.attained = attained[i]
        v.preemptions += 1
        n_preempt[i] += 1
        prio[i] = priority(v)
        push_waiting(i)

    def schedule(t: float) -> None:
        while True:
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
            if head is None:
                return
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
    t = 0.0
    while True:
        if next_arrival < n and (not events or arrival[next_arrival] <= events[0][0]):
            i = next_arrival
            next_arrival += 1
            t = arrival[i]
            v = JobView(i, JOB_TYPES[jtype[i]], tenant[i], demand[i], t, est[i])
            v.eval_se = eval_se[i]
            views[i] = v
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
        n_events += 1
        # an evaluation landed: checkpoint `c` of job `i`
        c = next_cp[i]
        k = cp_start[i] + c
        p = cp_prog[k]
        e = cp_eval[k]
        busy[i] += t - run_start[i]
        attained[i] = p * duration[i]
        v = views[i]
        v.attained = attained[i]
        v.progress = p
        v.eval_history.append(e)
        v.loss_history.append(cp_loss[k])
        v.reward_history.append(cp_reward[k])
        v.progress_history.append(p)
        b = best[i]
        # useful: clears the quality bar and beats the previous best by the minimum relative gain
        if e >= thr and (b == NEG_INF or e >= b + imp * abs(b)):
            busy_useful[i] = busy[i]
            if first_useful[i] != first_useful[i]:
                first_useful[i] = t
        if e > b:
            best[i] = e
            best_k[i] = k
        last = k == cp_start[i + 1] - 1
        stop = on_checkpoint(v)
        if stop or last:
            state[i] = DONE
            free += demand[i]
            end[i] = t
            stopped[i] = stop
            stop_prog[i] = p
            end_k[i] = k
            final_eval[i] = e
            if not last:
                saved[i] = (1.0 - p) * duration[i] + (cp_start[i + 1] - 1 - k) * eval_min[i]
            forget(i)
            views[i] = None  # histories are no longer needed: keep memory flat on huge runs
            n_done += 1
            if progress is not None and n_done % tick == 0:
                progress(n_done)
            schedule(t)
            continue
        # train on to the next checkpoint without leaving the GPUs
        next_cp[i] = c + 1
        run_start[i] = t
        seg_over[i] = 0.0
        seg_train[i] = (cp_prog[k + 1] - p) * duration[i]
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
        end=np.array(end),
        stopped=np.array(stopped, dtype=bool),
        stop_progress=np.array(stop_prog),
        busy=np.array(busy),
        busy_at_useful=np.array(busy_useful),
        first_useful=np.array(first_useful),
        best_eval=np.array(best),
        best_index=np.array(best_k, dtype=np.int64),
        end_index=np.array(end_k, dtype=np.int64),
        final_eval=np.array(final_eval),
        saved_minutes=np.array(saved),
        preemptions=np.array(n_preempt, dtype=np.int64),
        events=n_events,
        makespan=t,
    )
