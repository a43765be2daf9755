"""Alerts 11-12, on the critic-free group methods (`algorithm: grpo | rloo`): the baseline of each completion is the
other completions of its prompt, so a group whose rewards are all equal gives every member advantage 0 and a group
whose rewards barely differ gives almost none (or, with grpo's `scale_rewards: group`, noise blown up to full size).
Both read the trainer's per-step group figures (StepRecord.group_flat_frac, group_reward_std; NaN for ppo, which
samples one completion per prompt) and apply only to runs with groups (`requires = "groups"`): a catalog built for
ppo leaves them out (`Catalog.not_evaluated`). Streaming monitor and vectorised `scan` per alert.

Plain numpy: no Prefect or MLflow here.
"""

from __future__ import annotations

import numpy as np

from eval.detector_base import NAN, Monitor
from eval.health.base import HealthAlert, PersistentBreach, _AlertMonitor
from eval.health.kernels import _first_true, _fmt, _runs_of


# --------------------------------------------------------------------------- 11. flat groups
class FlatGroups(PersistentBreach):
    """The share of the step's groups whose rewards are all equal stays above `max_flat` for `persist` consecutive
    steps: more than nine prompts in ten give their completions identical rewards (all solved, all failed, or a
    constant reward), so the update rests on under a tenth of the batch while the whole batch is paid for. DAPO
    (Yu et al. 2025) resamples such groups away ("dynamic sampling") for this reason. Steps without the figure
    (NaN: no group had two scored members) break the run of flat steps."""

    name = "flat_groups"
    needs = ("group_flat_frac",)
    requires = "groups"
    title = "Flat reward groups"
    reason = "almost every prompt's completions get the same reward, so the run has (almost) no learning signal"
    first_response = (
        "check the reward function's output (constant, saturated or too coarse) and prompt difficulty (all solved "
        "or all failed); filter or resample flat groups (DAPO dynamic sampling), raise ppo.group_size, or move to "
        "harder / easier prompts"
    )

    def __init__(self, max_flat: float = 0.9, persist: int = 5):
        if not 0.0 <= max_flat < 1.0 or persist < 1:
            raise ValueError("flat_groups: need 0 <= max_flat < 1, persist >= 1")
        self.max_flat, self.persist = float(max_flat), int(persist)

    def breached(self, flat):
        return flat > self.max_flat

    def describe(self, flat: float) -> str:
        return (f"{_fmt(100.0 * flat)}% of the groups have all-equal rewards (> {100.0 * self.max_flat:g}%) "
                f"for {self.persist} steps")


# --------------------------------------------------------------------------- 12. group spread collapse
class GroupSpreadCollapse(HealthAlert):
    """The mean within-group reward std falls to at most `frac` of the run's own early level for `persist`
    consecutive steps. The early level is the mean of the first `window` steps that report the figure (judged only
    after them); a run whose early level is 0 fires on `persist` steps of exactly 0 after it. A relative bar,
    because the reward's scale is the tenant's: a healthy run's spread shrinks as prompts get solved (with half
    the groups solved, to about half its early level), a collapsed one to almost nothing: the completions of a
    prompt became the same answer (mode collapse) or the reward stopped telling them apart. Unlike `flat_groups`
    this also sees continuous rewards, where groups are never exactly flat. Steps without the figure (NaN) neither
    set the early level nor count, and break the run of low steps."""

    name = "group_spread_collapse"
    needs = ("group_reward_std",)
    requires = "groups"
    title = "Group reward-spread collapse"
    reason = "the completions of each prompt now get nearly the same reward: the run no longer learns which is better"
    first_response = (
        "check policy entropy and sampling temperature (identical completions) and the reward's resolution "
        "(saturated or quantised scores); with grpo's scale_rewards group, tiny spreads become full-size noisy "
        "advantages"
    )

    def __init__(self, window: int = 20, frac: float = 0.1, persist: int = 5):
        if window < 4 or not 0.0 <= frac < 1.0 or persist < 1:
            raise ValueError("group_spread_collapse: need window >= 4, 0 <= frac < 1, persist >= 1")
        self.window, self.frac, self.persist = int(window), float(frac), int(persist)

    def start(self) -> Monitor:
        return _SpreadMonitor(self)

    def _scan(self, s, n_runs, n_steps):
        w, std = self.w, s["group_reward_std"]
        seen = np.isfinite(std)
        count = np.cumsum(seen, axis=1)
        total = np.cumsum(np.where(seen, std, 0.0), axis=1)  # left to right, as the monitor adds
        set_at = _first_true(count >= w)  # the row where the early level is complete
        row = np.maximum(set_at, 0)
        ref = np.where(set_at >= 0, total[np.arange(n_runs), row] / w, np.nan)
        judged = np.arange(n_steps)[None, :] > np.where(set_at >= 0, set_at, n_steps)[:, None]
        with np.errstate(invalid="ignore"):
            low = judged & (std <= self.frac * ref[:, None])
        return _first_true(_runs_of(low, self.persist))


class _SpreadMonitor(_AlertMonitor):
    __slots__ = ("seen", "total", "ref", "count")

    def __init__(self, alert):
        super().__init__(alert)
        self.seen = 0
        self.total = 0.0
        self.ref = NAN
        self.count = 0

    def _observe(self, cp):
        a: GroupSpreadCollapse = self.alert  # type: ignore[assignment]
        std = float(getattr(cp, "group_reward_std", NAN))
        if self.seen < a.w:  # still measuring the early level
            if np.isfinite(std):
                self.seen += 1
                self.total += std
                if self.seen == a.w:
                    self.ref = self.total / a.w
            return False
        self.count = self.count + 1 if std <= a.frac * self.ref else 0
        if self.count >= a.persist:
            self.detail = (
                f"mean within-group reward std {_fmt(std)} <= {a.frac:g} x its early level {_fmt(self.ref)} "
                f"for {a.persist} steps"
            )
            return True
        return False
