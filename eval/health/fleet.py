"""A synthetic fleet of per-step health series (healthy PPO-like runs plus one injected fault per alert),
for benchmarking the catalog and measuring each alert's false-positive rate on healthy runs.
"""

from __future__ import annotations

import numpy as np

from eval.health.catalog import Catalog
from eval.registry import ALERTS

# --------------------------------------------------------------------------- synthetic fleet
FAULTS = ("healthy", *ALERTS)


def synthetic_fleet(
    n_runs: int, n_steps: int, seed: int = 0, fault_frac: float = 0.3, gate_every: int = 10
) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
    """A fleet of per-step health series: mostly healthy PPO-like runs, plus runs with one injected
    fault per alert (onset between 30% and 70% of the run). Every run also carries the group figures a grpo/rloo
    run reports (`group_flat_frac`, `group_reward_std`), so the group alerts are measured on the same fleet.
    Returns (series, fault name per run, onset index per run; -1 for healthy). Used to benchmark the catalog and
    to measure false-positive rates."""
    rng = np.random.default_rng(seed)
    t = np.arange(n_steps, dtype=np.float64)[None, :]
    shape = (n_runs, n_steps)
    kinds = np.zeros(n_runs, dtype=np.int64)
    n_fault = int(round(n_runs * fault_frac))
    kinds[:n_fault] = 1 + np.arange(n_fault) % (len(FAULTS) - 1)
    rng.shuffle(kinds)
    onset = np.where(kinds > 0, rng.integers(int(0.3 * n_steps), int(0.7 * n_steps) + 1, n_runs), -1)
    col = lambda v: np.asarray(v, dtype=np.float64)[:, None]  # noqa: E731
    after = t >= col(np.maximum(onset, 0)) if n_runs else np.zeros(shape, bool)
    since = np.maximum(t - col(np.maximum(onset, 0)), 0.0)
    is_ = {name: col(kinds == i).astype(bool) for i, name in enumerate(FAULTS)}

    tau = col(rng.uniform(0.4, 1.5, n_runs)) * n_steps
    r0, r1 = col(rng.uniform(0.1, 0.3, n_runs)), col(rng.uniform(0.6, 0.9, n_runs))
    learn = 1.0 - np.exp(-t / tau)
    reward = r0 + (r1 - r0) * learn + rng.normal(0, 1, shape) * col(rng.uniform(0.005, 0.03, n_runs))
    e0, e1 = col(rng.uniform(0.2, 0.35, n_runs)), col(rng.uniform(0.5, 0.7, n_runs))
    evals = e0 + (e1 - e0) * learn + rng.normal(0, 0.01, shape)
    kl = col(rng.uniform(0.05, 0.3, n_runs)) * (t / n_steps) + np.abs(rng.normal(0, 0.003, shape))
    entropy = col(rng.uniform(1.5, 2.5, n_runs)) * np.exp(-t / (4 * tau)) + rng.normal(0, 0.03, shape)
    grad = np.exp(rng.normal(0.0, 0.15, shape)) * col(rng.uniform(0.5, 2.0, n_runs))
    length = col(rng.uniform(30, 120, n_runs)) * (1 + 0.2 * learn) + rng.normal(0, 2, shape)
    trunc = np.clip(0.03 + rng.normal(0, 0.01, shape), 0, 1)
    unparse = np.clip(0.02 + rng.normal(0, 0.01, shape), 0, 1)

    at = lambda name: is_[name] & after  # noqa: E731
    reward = np.where(at("reward_band"), reward + 0.5 + 0.01 * since, reward)
    kl = np.where(at("kl_blowup"), kl + 0.02 * since, kl)
    entropy = np.where(at("entropy_collapse"), entropy * np.exp(-since / 40.0), entropy)
    hack_r = reward + 0.002 * since
    hack_e = evals - 0.003 * since
    reward = np.where(at("reward_hacking"), hack_r, reward)
    evals = np.where(at("reward_hacking"), hack_e, evals)
    # dead: learning stops at onset; reward and KL stay where they were, up to noise
    o = col(np.maximum(onset, 0))
    frozen_r = r0 + (r1 - r0) * (1.0 - np.exp(-o / tau))
    frozen_kl = kl[np.arange(n_runs), np.maximum(onset, 0)][:, None] if n_runs else kl[:, :1]
    reward = np.where(at("dead_run"), frozen_r + rng.normal(0, 0.01, shape), reward)
    kl = np.where(at("dead_run"), frozen_kl + rng.normal(0, 0.001, shape), kl)
    spikes = at("grad_norm_spike") & (rng.random(shape) < 0.25)
    grad = np.where(spikes, grad * 8.0, grad)
    drift = at("rollout_drift")
    length = np.where(drift, length * 2.0, length)
    trunc = np.where(drift, np.clip(trunc + 0.3, 0, 1), trunc)
    staleness = rng.integers(0, 3, shape).astype(np.float64) * 0.5  # healthy overlap: 0-1 versions
    staleness = np.where(at("sync_stall"), since, staleness)  # frozen sync: the lag grows every step

    # off-policy signals, drawn after all of the above so those series stay what they were: a healthy overlap
    # run's importance-weight ESS sits near 1; carried responses are 2-6x the fresh ones' length (they are the
    # stragglers), and some steps train no carried response at all
    ess = np.clip(1.0 - np.abs(rng.normal(0, 0.05, shape)), 0.0, 1.0)
    ess = np.where(at("low_ess"), ess * np.exp(-since / 10.0), ess)  # the behaviour policy drifts away
    fresh = length * col(rng.uniform(0.4, 0.8, n_runs)) * np.exp(rng.normal(0, 0.1, shape))
    carried = fresh * col(rng.uniform(2.0, 6.0, n_runs)) * np.exp(rng.normal(0, 0.25, shape))
    carried = np.where(rng.random(shape) < 0.15, np.nan, carried)
    carried = np.where(at("carried_length_drift"), carried * 2.5, carried)  # carried tokens repeated on resume

    # group signals (grpo/rloo), drawn after all of the above so those series stay what they were. A healthy run
    # trains 16-128 groups a step; the share of groups with all-equal rewards rises from 5-30% to 30-70% as prompts
    # get solved (a binomial draw over the step's groups), and the mean within-group reward std is the spread of the
    # groups that are not flat (its scale the tenant's reward's) times the share of those
    n_groups = col(rng.choice([16, 32, 64, 128], n_runs))
    pf0, pf1 = col(rng.uniform(0.05, 0.3, n_runs)), col(rng.uniform(0.3, 0.7, n_runs))
    p_flat = pf0 + (pf1 - pf0) * learn
    p_flat = np.where(at("flat_groups"), col(rng.uniform(0.97, 1.0, n_runs)), p_flat)  # a constant or saturated reward
    flat_frac = rng.binomial(np.broadcast_to(n_groups, shape).astype(np.int64), p_flat) / n_groups
    spread = col(rng.uniform(0.2, 0.45, n_runs) * np.exp(rng.uniform(np.log(0.05), np.log(2.0), n_runs)))
    group_std = (1.0 - flat_frac) * spread * np.exp(rng.normal(0, 0.15, shape))
    # spread collapse with a continuous reward: no group is ever exactly flat, but its members' rewards converge
    group_std = np.where(at("group_spread_collapse"), group_std * np.exp(-since / 15.0), group_std)

    gated = (np.arange(n_steps) % gate_every == gate_every - 1)[None, :]
    series = {
        "step": np.broadcast_to(t, shape).copy(),
        "eval_score": np.where(gated, evals, np.nan),
        "reward": reward, "kl": kl, "entropy": entropy, "grad_norm": grad, "response_len": length,
        "truncation_rate": trunc, "unparseable_rate": unparse,
        "gpu_seconds": np.ones(shape), "staleness": staleness,
        "is_ess": ess, "len_carried": carried, "len_fresh": fresh,
        "group_flat_frac": flat_frac, "group_reward_std": group_std,
    }
    return series, np.array(FAULTS)[kinds], onset


def measure_false_positive_rates(
    catalog: Catalog, n_runs: int = 2000, n_steps: int = 1000, seed: int = 0
) -> dict[str, float]:
    """Fraction of the synthetic fleet's healthy runs on which each alert fires."""
    series, kind, _ = synthetic_fleet(n_runs, n_steps, seed=seed, fault_frac=0.0)
    first = catalog.scan(series)
    return {name: float((f >= 0).mean()) for name, f in first.items()}
