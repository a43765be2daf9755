"""Window kernels of the run-health alerts, and the array helpers their vectorised `scan`s share.

Plain numpy: no Prefect or MLflow here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

# --------------------------------------------------------------------------- window kernels
# Each kernel maps windows shaped (..., w) to one statistic per window. Monitors call them on a
# (1, 1, w) array holding their current window; `scan` calls them on (runs, windows, w). Numpy
# reduces each last-axis row with the same inner loop either way, so both give identical floats.


def _blocks(x: np.ndarray, w: int) -> np.ndarray:
    """(runs, steps) -> (runs, complete windows, w)."""
    nb = x.shape[1] // w
    return x[:, : nb * w].reshape(x.shape[0], nb, w)


def _quartiles(win: np.ndarray, min_n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Linear-interpolated quartiles of each window, ignoring NaN; NaN where fewer than min_n values.
    (numpy's default quantile method, written out so NaN-free windows need one sort and no gathers.)"""
    s = np.sort(win, axis=-1)  # NaN sorts last
    w = win.shape[-1]
    out = []
    if not np.isnan(s[..., -1]).any():  # no window holds NaN: every window has w values
        for q in (0.25, 0.5, 0.75):
            pos = q * (w - 1)
            lo = int(math.floor(pos))
            hi = min(lo + 1, w - 1)
            frac = pos - lo
            v = s[..., lo] + frac * (s[..., hi] - s[..., lo])
            out.append(v if w >= min_n else np.full(v.shape, np.nan))
        return out[0], out[1], out[2]
    n = (~np.isnan(win)).sum(axis=-1)
    for q in (0.25, 0.5, 0.75):
        pos = q * (np.maximum(n, 1) - 1)
        lo = np.floor(pos).astype(np.int64)
        hi = np.minimum(lo + 1, np.maximum(n - 1, 0))
        frac = pos - lo
        v_lo = np.take_along_axis(s, lo[..., None], axis=-1)[..., 0]
        v_hi = np.take_along_axis(s, hi[..., None], axis=-1)[..., 0]
        v = v_lo + frac * (v_hi - v_lo)
        out.append(np.where(n >= min_n, v, np.nan))
    return out[0], out[1], out[2]


@dataclass(slots=True)
class _Sums:
    """Least-squares sums of one window with local x = 0..w-1 (NaN values left out)."""

    n: np.ndarray
    sx: np.ndarray
    sxx: np.ndarray
    sy: np.ndarray
    sxy: np.ndarray
    syy: np.ndarray


def _rsum(a: np.ndarray) -> np.ndarray:
    """Sum over the last axis. einsum's sum-of-products loop reduces each window on its own, in the
    same order whatever the leading shape, and is several times faster than `.sum(-1)` on short rows."""
    return np.einsum("...w->...", a)


def _rdot(a: np.ndarray, v: np.ndarray) -> np.ndarray:
    return np.einsum("...w,w->...", a, v)


def _rsq(a: np.ndarray) -> np.ndarray:
    return np.einsum("...w,...w->...", a, a)


def _window_sums(win: np.ndarray, with_syy: bool = False) -> _Sums:
    """Sums of each window. When no window holds NaN a shorter path yields the same floats (the masked
    terms are exact copies and the x-sums are exact integers)."""
    w = win.shape[-1]
    x = np.arange(w, dtype=np.float64)
    sy = _rsum(win)
    if not np.isnan(sy).any():
        shape = win.shape[:-1]
        return _Sums(
            n=np.full(shape, float(w)),
            sx=np.full(shape, x.sum()),
            sxx=np.full(shape, (x * x).sum()),
            sy=sy,
            sxy=_rdot(win, x),
            syy=_rsq(win) if with_syy else None,  # type: ignore[arg-type]
        )
    valid = ~np.isnan(win)
    y0 = np.where(valid, win, 0.0)
    m = valid.astype(np.float64)
    return _Sums(
        n=_rsum(m),
        sx=_rdot(m, x),
        sxx=_rdot(m, x * x),
        sy=_rsum(y0),
        sxy=_rdot(y0, x),
        syy=_rsq(y0) if with_syy else None,  # type: ignore[arg-type]
    )


def _slope(s: _Sums, min_n: int) -> np.ndarray:
    """Least-squares slope per row (NaN where fewer than min_n points)."""
    den = s.n * s.sxx - s.sx * s.sx
    with np.errstate(invalid="ignore", divide="ignore"):
        slope = (s.n * s.sxy - s.sx * s.sy) / den
    return np.where((s.n >= min_n) & (den > 0), slope, np.nan)


def _slope_se(s: _Sums) -> np.ndarray:
    """Standard error of the least-squares slope (needs `syy`); NaN with fewer than 3 points."""
    with np.errstate(invalid="ignore", divide="ignore"):
        cxx = s.sxx - s.sx * s.sx / s.n
        cxy = s.sxy - s.sx * s.sy / s.n
        cyy = s.syy - s.sy * s.sy / s.n
        rss = np.maximum(cyy - (cxy / cxx) * cxy, 0.0)
        return np.sqrt(rss / (s.n - 2.0) / cxx)


def _mean_var(win: np.ndarray, min_n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Mean, unbiased variance and count of each window, ignoring NaN (NaN-free windows: same floats)."""
    total = _rsum(win)
    if not np.isnan(total).any():
        n = np.full(win.shape[:-1], float(win.shape[-1]))
        mean = total / n
        var = _rsq(win - mean[..., None]) / (n - 1)
        if win.shape[-1] >= min_n:
            return mean, var, n
        return np.full(n.shape, np.nan), np.full(n.shape, np.nan), n
    valid = ~np.isnan(win)
    n = _rsum(valid.astype(np.float64))
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = _rsum(np.where(valid, win, 0.0)) / n
        var = _rsq(np.where(valid, win - mean[..., None], 0.0)) / (n - 1)
    ok = n >= min_n
    return np.where(ok, mean, np.nan), np.where(ok, var, np.nan), n


def _first_true(mask: np.ndarray) -> np.ndarray:
    """Per row, the first True column or -1."""
    if mask.shape[1] == 0:
        return np.full(mask.shape[0], -1, dtype=np.int64)
    idx = np.argmax(mask, axis=1)
    return np.where(mask.any(axis=1), idx, -1).astype(np.int64)


def _runs_of(mask: np.ndarray, k: int) -> np.ndarray:
    """mask[:, t] and the k-1 columns before it all True (k consecutive), same shape as mask."""
    out = mask.copy()
    for j in range(1, k):
        out[:, j:] &= mask[:, :-j]
        out[:, :j] = False
    return out


def _lengths(series: dict[str, np.ndarray], n_runs: int, n_steps: int) -> np.ndarray:
    """Observations per run: NaN-padding at the end of a row is not part of the run."""
    if "step" in series:
        present = ~np.isnan(series["step"])
    else:
        present = np.zeros((n_runs, n_steps), dtype=bool)
        for arr in series.values():
            present |= ~np.isnan(arr)
    last = n_steps - np.argmax(present[:, ::-1], axis=1)
    return np.where(present.any(axis=1), last, 0)


def _outside_prev(x: np.ndarray, w: int, lo: np.ndarray | None, hi: np.ndarray) -> np.ndarray:
    """(runs, steps) bool: step t lies outside (lo, hi) of window t // w - 1 (the trailing complete window).
    `lo`/`hi` are per complete window, (runs, windows); `lo=None` checks the upper side only."""
    n_runs, n_steps = x.shape
    nb = hi.shape[1]
    out = np.zeros((n_runs, n_steps), dtype=bool)
    if nb >= 2:
        xb = x[:, w : nb * w].reshape(n_runs, nb - 1, w)
        o = xb > hi[:, :-1, None]
        if lo is not None:
            o |= xb < lo[:, :-1, None]
        out[:, w : nb * w] = o.reshape(n_runs, -1)
    if nb >= 1 and n_steps > nb * w:
        xt = x[:, nb * w :]
        o = xt > hi[:, -1:]
        if lo is not None:
            o |= xt < lo[:, -1:]
        out[:, nb * w :] = o
    return out


#: runs per chunk in `scan`: keeps each temporary (runs x steps) array within the L3 cache
CHUNK_RUNS = 256


def _as_arrays(series: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], int, int]:
    if not series:
        raise ValueError("scan: no series given")
    arrays = {k: np.ascontiguousarray(v, dtype=np.float64) for k, v in series.items()}
    shapes = {v.shape for v in arrays.values()}
    if len(shapes) != 1 or len(next(iter(shapes))) != 2:
        raise ValueError(f"scan: series must be (runs, steps) arrays of one shape, got {shapes}")
    n_runs, n_steps = next(iter(shapes))
    return arrays, n_runs, n_steps


def _fmt(v: float) -> str:
    return f"{v:.4g}"
