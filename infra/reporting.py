"""The analyst's report: tonight's nightly against the last one, per scheduler and per tenant, read back from MLflow
(`infra/tracking.py` writes the runs), and its markdown."""

from __future__ import annotations

import json
import math
from typing import Any

import pandas as pd

from infra.tracking import (
    ALGORITHM_TAG,
    DEFAULT_EXPERIMENT,
    KIND_TAG,
    NAMES_TAG,
    PARENT_TAG,
    TENANT_TAG,
    client,
    init_store,
)


def _runs(filter_string: str, experiment: str = DEFAULT_EXPERIMENT) -> pd.DataFrame:
    import mlflow

    init_store()
    if client().get_experiment_by_name(experiment) is None:
        return pd.DataFrame()
    return mlflow.search_runs(experiment_names=[experiment], filter_string=filter_string,
                              order_by=["attributes.start_time DESC"], max_results=50000)


def _descendants(root_id: str, all_runs: pd.DataFrame) -> pd.DataFrame:
    """Every run below `root_id` (children, grandchildren, ...) by the parent tag."""
    col = f"tags.{PARENT_TAG}"
    if all_runs.empty or col not in all_runs:
        return all_runs.iloc[0:0]
    keep, frontier = set(), {root_id}
    while frontier:
        kids = set(all_runs.loc[all_runs[col].isin(frontier), "run_id"]) - keep
        keep |= kids
        frontier = kids
    return all_runs[all_runs["run_id"].isin(keep)]


SCHEDULER_METRICS = ["jct_mean", "ttfuc_mean", "wasted_frac", "saved_frac", "precision", "recall", "fpr", "jain"]


def scheduler_table(root_id: str, all_runs: pd.DataFrame) -> pd.DataFrame:
    """Long table (experiment, variant, scheduler, metric, value) from a nightly's simulation variant runs."""
    runs = _descendants(root_id, all_runs)
    runs = runs[runs.get(f"tags.{KIND_TAG}", pd.Series(dtype=str)) == "sim_variant"]
    rows = []
    for _, r in runs.iterrows():
        names = json.loads(r.get(f"tags.{NAMES_TAG}") or "{}")
        for col, value in r.items():
            if not col.startswith("metrics.") or "/" not in col or pd.isna(value):
                continue
            metric, key = col[len("metrics."):].split("/", 1)
            if metric in SCHEDULER_METRICS:
                rows.append({"experiment": r.get("params.experiment"), "variant": r.get("params.variant"),
                             "scheduler": names.get(key, key), "metric": metric, "value": float(value)})
    return pd.DataFrame(rows, columns=["experiment", "variant", "scheduler", "metric", "value"])


TENANT_METRICS = ["cost_usd", "gpu_hours", "steps", "tokens_generated", "best_eval"]
#: the tenant table's keys: a tenant's PPO and GRPO jobs are compared each with its own kind, never summed together
TENANT_KEYS = ["tenant", "algorithm"]


def run_algorithm(runs: pd.DataFrame) -> pd.Series:
    """Each job run's training algorithm: its `algorithm` tag (every job run has it:
    `training.inputs.job_inputs.job_lineage`),
    else its `algorithm` param (logged when the run opens, so a job that failed before its tags has it), else what an
    earlier version's `ppo.advantage` param says, else ppo (runs from before the algorithm existed trained PPO)."""
    out = pd.Series("", index=runs.index, dtype=object)
    from training.job.config import ALGORITHM_OF_ADVANTAGE

    sources = ((f"tags.{ALGORITHM_TAG}", None), ("params.algorithm", None),
               ("params.ppo.advantage", ALGORITHM_OF_ADVANTAGE))
    for col, values in sources:
        if col not in runs:
            continue
        got = runs[col].fillna("").astype(str)
        if values is not None:
            got = got.map(lambda v, m=values: m.get(v, ""))
        out = out.where(out != "", got)
    return out.replace("", "ppo")


def tenant_table(root_id: str, all_runs: pd.DataFrame) -> pd.DataFrame:
    """Per-tenant and per-algorithm sums of the cost metrics of a nightly's job runs (RLHF jobs, platform jobs)."""
    columns = [*TENANT_KEYS, "metric", "value"]
    runs = _descendants(root_id, all_runs)
    if runs.empty or f"tags.{TENANT_TAG}" not in runs:
        return pd.DataFrame(columns=columns)
    runs = runs[runs.get(f"tags.{KIND_TAG}", pd.Series(dtype=str)).isin(["rlhf_job", "platform_job"])]
    runs = runs.assign(_algorithm=run_algorithm(runs))
    rows = []
    for (tenant, algorithm), g in runs.groupby([f"tags.{TENANT_TAG}", "_algorithm"]):
        key = {"tenant": tenant, "algorithm": algorithm}
        rows.append({**key, "metric": "jobs", "value": float(len(g))})
        for m in TENANT_METRICS:
            col = f"metrics.{m}"
            if col in g and g[col].notna().any():
                agg = g[col].max() if m == "best_eval" else g[col].sum()
                rows.append({**key, "metric": m, "value": float(agg)})
    return pd.DataFrame(rows, columns=columns)


PROMOTION_COLUMNS = ["job", "version", "decision", "changed", "reason"]


def promotion_table(root_id: str, all_runs: pd.DataFrame) -> pd.DataFrame:
    """The promotion decision on each job run of a nightly that registered a version (`promotion.*` tags of its
    run, `flows.rlhf_job.promotion_tags`): the version, promoted or kept holder, the identity parts that changed
    (a refusal for a different gate or prompt set) and the one-line reason."""
    runs = _descendants(root_id, all_runs)
    col = "tags.promotion.decision"
    if runs.empty or col not in runs:
        return pd.DataFrame(columns=PROMOTION_COLUMNS)
    runs = runs[runs[col].notna()]

    def tag(r: pd.Series, key: str) -> str:
        value = r.get(f"tags.{key}")
        return "" if value is None or pd.isna(value) else str(value)

    return pd.DataFrame([{"job": tag(r, "mlflow.runName") or r["run_id"], "version": tag(r, "promotion.version"),
                          "decision": tag(r, "promotion.decision"), "changed": tag(r, "promotion.changed"),
                          "reason": tag(r, "promotion.reason")} for _, r in runs.iterrows()],
                        columns=PROMOTION_COLUMNS)


def compare(tonight: pd.DataFrame, last: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """Side by side: tonight, last night, delta (tonight - last) per key and metric."""
    on = keys + ["metric"]
    t = tonight.rename(columns={"value": "tonight"})
    if last is None or last.empty:
        out = t.assign(last=float("nan"))
    else:
        out = t.merge(last.rename(columns={"value": "last"}), on=on, how="outer")
    out["delta"] = out["tonight"] - out["last"]
    return out[on + ["tonight", "last", "delta"]]


def nightly_report(experiment: str = DEFAULT_EXPERIMENT, tonight_id: str | None = None) -> dict[str, Any]:
    """Tonight (`tonight_id`, which may still be running, or else the newest finished nightly) against the
    newest finished nightly that started before it."""
    empty = {"tonight": None, "last": None, "schedulers": pd.DataFrame(), "tenants": pd.DataFrame(),
             "promotions": pd.DataFrame(columns=PROMOTION_COLUMNS)}
    # the nightly runs first, then only the runs since the last one's start: reading the whole experiment grew
    # with every night (5.7 s at 2,000 runs here, and capped at 50,000 runs)
    nights = _runs(f"tags.`{KIND_TAG}` = 'nightly'", experiment)
    if nights.empty:
        return empty
    if tonight_id is not None:
        match = nights[nights["run_id"] == tonight_id]
        if match.empty:
            return empty
        tonight = match.iloc[0]
    else:
        done = nights[nights["status"] == "FINISHED"]
        if done.empty:
            return empty
        tonight = done.iloc[0]
    earlier = nights[(nights["status"] == "FINISHED") & (nights["start_time"] < tonight["start_time"])
                     & (nights["run_id"] != tonight["run_id"])]
    last = earlier.iloc[0] if len(earlier) else None
    since = pd.Timestamp((last if last is not None else tonight)["start_time"])
    all_runs = _runs(f"attributes.start_time >= {int(since.timestamp() * 1000)}", experiment)
    sched = compare(scheduler_table(tonight.run_id, all_runs),
                    scheduler_table(last.run_id, all_runs) if last is not None else None,
                    ["experiment", "variant", "scheduler"])
    sched = sched.sort_values(["experiment", "variant", "scheduler"], kind="stable", ignore_index=True)
    ten = compare(tenant_table(tonight.run_id, all_runs),
                  tenant_table(last.run_id, all_runs) if last is not None else None, TENANT_KEYS)
    return {"tonight": tonight, "last": last, "schedulers": sched, "tenants": ten,
            "promotions": promotion_table(tonight.run_id, all_runs)}


def _fmt(x: Any) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "—"
    x = float(x)
    return f"{x:,.0f}" if abs(x) >= 1000 else f"{x:.4g}"


def report_markdown(rep: dict[str, Any], metrics: tuple[str, ...] = ("jct_mean", "wasted_frac", "precision",
                                                                      "recall")) -> str:
    """The report as markdown: one scheduler table (a column pair per metric) and one tenant table."""
    if rep["tonight"] is None:
        return "# Nightly report\n\nNo finished nightly run in MLflow yet: run `rlhfops nightly --quick`.\n"
    t, last = rep["tonight"], rep["last"]
    when = pd.Timestamp(t["start_time"]).strftime("%Y-%m-%d %H:%M")
    lines = ["# Nightly report", "",
             f"Tonight: run `{t.run_id}` ({when})"
             + (f"; last: run `{last.run_id}` ({pd.Timestamp(last['start_time']).strftime('%Y-%m-%d %H:%M')})"
                if last is not None else "; no earlier nightly to compare with") + ".", ""]
    s = rep["schedulers"]
    if not s.empty:
        lines += ["## Schedulers (simulation matrix)", "",
                  "Delta = tonight − last. JCT in minutes; wasted, precision and recall as fractions.", ""]
        wide = s[s.metric.isin(metrics)].pivot_table(index=["experiment", "variant", "scheduler"], columns="metric",
                                                     values=["tonight", "last", "delta"], aggfunc="first",
                                                     sort=False)
        header = ["experiment", "variant", "scheduler"]
        for m in metrics:
            header += [f"{m} tonight", f"{m} last", f"{m} Δ"]
        lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        for idx, row in wide.iterrows():
            cells = list(map(str, idx))
            for m in metrics:
                cells += [_fmt(row.get(("tonight", m))), _fmt(row.get(("last", m))), _fmt(row.get(("delta", m)))]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    ten = rep["tenants"]
    if not ten.empty:
        lines += ["## Tenants (live jobs)", "", "| tenant | algorithm | metric | tonight | last | Δ |",
                  "|---|---|---|---|---|---|"]
        for _, r in ten.iterrows():
            lines.append(f"| {r.tenant} | {r.algorithm} | {r.metric} | {_fmt(r.tonight)} | {_fmt(r['last'])} | "
                         f"{_fmt(r.delta)} |")
        lines.append("")
    lines += promotion_lines(rep.get("promotions"))
    return "\n".join(lines)


def promotion_lines(promotions: pd.DataFrame | None) -> list[str]:
    """The report's registry section: one line per version tonight's jobs registered, whether it took `best` and
    why not (a refusal for a changed gate names the part: "gate code (fns.py:exact_match) changed: ...")."""
    if promotions is None or promotions.empty:
        return []
    lines = ["## Registry (tonight's jobs)", ""]
    for _, r in promotions.iterrows():
        changed = f" (changed: {r.changed})" if r.changed else ""
        lines.append(f"- {r.job}: {r.version or 'version'} {r.decision}{changed}: {r.reason}")
    return [*lines, ""]
