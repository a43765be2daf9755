"""Synthetic multi-tenant workload (EvalStop paper, Appendix A), generated vectorised with numpy.

Everything about a job is drawn up front from one seeded generator, including its eval and loss
values at every scheduled checkpoint: those depend only on how far training has progressed, never on
when the scheduler runs it. The hidden truth (duration, hacking label, peak progress) stays in this
`Workload`; schedulers and detectors only ever receive `JobView`s (see `jobview.py`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from scheduling.config import WorkloadConfig

JOB_TYPES = ("lora", "dpo", "rlhf")
LORA, DPO, RLHF = 0, 1, 2


@dataclass
class Workload:
    """Struct-of-arrays for `n` jobs. Checkpoint data is flat: job i owns `cp_start[i]:cp_start[i+1]`."""

    arrival: np.ndarray  # minutes
    job_type: np.ndarray  # int8 index into JOB_TYPES
    tenant: np.ndarray  # int16
    gpus: np.ndarray  # int32
    duration: np.ndarray  # true training minutes (hidden)
    eval_minutes: np.ndarray  # GPU-occupying minutes per evaluation
    hacking: np.ndarray  # bool (hidden label)
    peak_progress: np.ndarray  # hacking runs: true eval peak; NaN otherwise (hidden)
    cp_start: np.ndarray  # int64, length n+1
    cp_progress: np.ndarray  # float64, progress fraction of each checkpoint
    cp_eval: np.ndarray  # observed (noisy) eval score at each checkpoint
    cp_loss: np.ndarray  # observed training loss at each checkpoint
    cp_reward: np.ndarray  # proxy reward-model score at each checkpoint (rises in every regime)
    cp_clean: np.ndarray  # noise-free eval at each checkpoint (hidden: for regret and detection delay)
    eval_se: np.ndarray  # per job: the standard error its eval gate reports (the noise sigma)
    est_duration: np.ndarray  # per-type mean duration: the only duration a scheduler may use

    @property
    def n(self) -> int:
        return len(self.arrival)


def checkpoint_grid(interval: float) -> np.ndarray:
    """Evals at every `interval` of progress plus the final model (progress 1.0)."""
    k = int(np.floor(1.0 / interval + 1e-9))
    grid = interval * np.arange(1, k + 1)
    if grid[-1] < 1.0 - 1e-9:
        grid = np.append(grid, 1.0)
    return np.minimum(grid, 1.0)


def _noise(rng: np.random.Generator, cfg, n_jobs: int, n_cp: int) -> np.ndarray:
    """Eval noise for a block of jobs with the same checkpoint count: (n_jobs, n_cp)."""
    sigma = cfg.sigma
    if sigma == 0.0:
        return np.zeros((n_jobs, n_cp))
    if cfg.kind == "gaussian":
        return rng.normal(0.0, sigma, (n_jobs, n_cp))
    if cfg.kind == "student_t":
        # scaled so the standard deviation stays sigma: var(t_nu) = nu / (nu - 2)
        nu = cfg.df
        return rng.standard_t(nu, (n_jobs, n_cp)) * sigma * np.sqrt((nu - 2.0) / nu)
    # AR(1): stationary with marginal std sigma, lag-1 correlation rho
    rho = cfg.rho
    eps = rng.normal(0.0, sigma * np.sqrt(1.0 - rho * rho), (n_jobs, n_cp))
    out = np.empty_like(eps)
    out[:, 0] = rng.normal(0.0, sigma, n_jobs)
    for t in range(1, n_cp):
        out[:, t] = rho * out[:, t - 1] + eps[:, t]
    return out


def generate(cfg: WorkloadConfig, seed: int) -> Workload:
    rng = np.random.default_rng(seed)
    n = cfg.jobs
    mix = np.array([cfg.mix.lora, cfg.mix.dpo, cfg.mix.rlhf], dtype=float)
    job_type = rng.choice(3, size=n, p=mix / mix.sum()).astype(np.int8)
    tenant = rng.integers(0, cfg.tenants, size=n).astype(np.int16)
    arrival = np.cumsum(rng.exponential(1.0 / cfg.arrival_rate, size=n))

    spec = [cfg.lora, cfg.dpo, cfg.rlhf]
    lo_d = np.array([s.duration_min[0] for s in spec])[job_type]
    hi_d = np.array([s.duration_min[1] for s in spec])[job_type]
    duration = rng.uniform(lo_d, hi_d)
    lo_g = np.array([s.gpus[0] for s in spec])[job_type]
    hi_g = np.array([s.gpus[1] for s in spec])[job_type]
    gpus = rng.integers(lo_g, hi_g + 1).astype(np.int32)
    eval_minutes = np.array([s.eval_minutes for s in spec], dtype=float)[job_type]
    est_duration = np.array([(s.duration_min[0] + s.duration_min[1]) / 2 for s in spec])[job_type]

    is_rlhf = job_type == RLHF
    hacking = is_rlhf & (rng.random(n) < cfg.hack_fraction)
    rc = cfg.rlhf.curve
    peak = np.where(hacking, rng.uniform(*rc.peak_progress, size=n), np.nan)

    # Per-job curve parameters, drawn for every job (unused ones are ignored) so that a job's
    # curve does not change when another parameter of the experiment changes.
    e_start = rng.uniform(*cfg.curves.eval_start, size=n)
    gain = rng.uniform(*cfg.curves.eval_gain, size=n)
    tau = rng.uniform(*cfg.curves.lora_tau, size=n)
    p_sat = rng.uniform(*cfg.curves.dpo_saturation, size=n)
    tau_h = rng.uniform(*rc.healthy_tau, size=n)
    drop = rng.uniform(*rc.drop, size=n)
    loss0 = rng.uniform(*cfg.curves.loss_start, size=n)
    loss_floor = rng.uniform(*cfg.curves.loss_floor, size=n)
    loss_plateau = rng.uniform(*cfg.curves.loss_plateau, size=n)
    # LoRA/DPO losses keep improving through training; RLHF losses flatten at `loss_plateau`.
    loss_tau = np.where(is_rlhf, loss_plateau / 4.0, cfg.curves.sft_loss_tau)

    grids = [checkpoint_grid(s.eval_interval) for s in spec]
    n_cp = np.array([len(g) for g in grids])[job_type]
    cp_start = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(n_cp, out=cp_start[1:])
    total = int(cp_start[-1])
    cp_progress = np.empty(total)
    cp_eval = np.empty(total)
    cp_loss = np.empty(total)
    cp_reward = np.empty(total)
    cp_clean = np.empty(total)
    reward_gain = rng.uniform(0.5, 1.0, size=n)
    reward_tau = rng.uniform(0.3, 0.6, size=n)

    for t, grid in enumerate(grids):
        idx = np.flatnonzero(job_type == t)
        if idx.size == 0:
            continue
        k = len(grid)
        p = np.broadcast_to(grid, (idx.size, k))
        es, g = e_start[idx, None], gain[idx, None]
        if t == LORA:
            clean = es + g * (1.0 - np.exp(-p / tau[idx, None]))
        elif t == DPO:
            x = np.minimum(p / p_sat[idx, None], 1.0)
            clean = es + g * (1.0 - (1.0 - x) ** 2)
        else:
            th = tau_h[idx, None]
            healthy = es + g * (1.0 - np.exp(-p / th)) / (1.0 - np.exp(-1.0 / th))
            pk = np.where(np.isnan(peak[idx]), 1.0, peak[idx])[:, None]
            rise = es + g * (1.0 - (1.0 - np.minimum(p / pk, 1.0)) ** 2)
            fall = es + g - drop[idx, None] * np.maximum(p - pk, 0.0) / np.maximum(1.0 - pk, 1e-9)
            clean = np.where(hacking[idx, None], np.where(p <= pk, rise, fall), healthy)
        noise_cfg = cfg.eval_noise if t == RLHF else cfg.sft_eval_noise
        observed = clean + _noise(rng, noise_cfg, idx.size, k)
        lt = loss_tau[idx, None]
        lf = loss_floor[idx, None]
        # exponential decay to the floor, plus a slow residual decline (RLHF runs keep shaving a
        # little off the loss after the plateau; LoRA/DPO have `loss_tail` 0 effect: still decaying)
        loss = lf * (1.0 + cfg.curves.loss_tail * (1.0 - p)) + (loss0[idx, None] - lf) * np.exp(-p / lt)
        loss = loss * (1.0 + rng.normal(0.0, cfg.curves.loss_noise, (idx.size, k)))
        # scatter rows of this type into the flat arrays
        flat = (cp_start[idx, None] + np.arange(k)[None, :]).ravel()
        cp_progress[flat] = p.ravel()
        cp_eval[flat] = observed.ravel()
        cp_loss[flat] = loss.ravel()
        cp_clean[flat] = clean.ravel()
        # the proxy (reward model) keeps rising in every regime: that is what makes it a proxy
        reward = reward_gain[idx, None] * (1.0 - np.exp(-p / reward_tau[idx, None]))
        cp_reward[flat] = (reward + rng.normal(0.0, 0.02, (idx.size, k))).ravel()

    return Workload(
        arrival=arrival,
        job_type=job_type,
        tenant=tenant,
        gpus=gpus,
        duration=duration,
        eval_minutes=eval_minutes,
        hacking=hacking,
        peak_progress=peak,
        cp_start=cp_start,
        cp_progress=cp_progress,
        cp_eval=cp_eval,
        cp_loss=cp_loss,
        cp_reward=cp_reward,
        cp_clean=cp_clean,
        eval_se=np.where(is_rlhf, cfg.eval_noise.sigma, cfg.sft_eval_noise.sigma),
        est_duration=est_duration,
    )
