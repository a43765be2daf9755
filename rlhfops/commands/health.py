"""`rlhfops health TRACE.csv`: run the run-health alert catalog over recorded runs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import typer

from common.errors import BadInput

#: optional per-step columns the catalog reads beyond the Trace CSV's (docs/ARCHITECTURE.md) (the trainer's StepRecord
#: carries them; older traces simply lack them)
EXTRA_COLUMNS = ("truncation_rate", "unparseable_rate", "gpu_seconds", "staleness", "reward_std", "group_flat_frac",
                 "group_reward_std")
ALERT_COLUMNS = ["run_id", "alert", "severity", "fired_step", "detail"]


def trace_to_series(df) -> tuple[list[str], dict[str, np.ndarray], np.ndarray, list, list]:
    """Pivot a validated, sorted trace into (runs, rows) arrays: (run ids, series, per-run step spacing,
    tenants, labels). Runs are NaN-padded at the end."""
    import pandas as pd

    from eval.health import SIGNALS

    codes, run_ids = pd.factorize(df["run_id"], sort=False)
    pos = df.groupby(codes, sort=False).cumcount().to_numpy()
    n_runs, n_rows = len(run_ids), int(pos.max()) + 1
    series: dict[str, np.ndarray] = {}
    for name in SIGNALS:
        if name in df.columns:
            arr = np.full((n_runs, n_rows), np.nan)
            arr[codes, pos] = df[name].to_numpy(dtype=np.float64)
            series[name] = arr
    steps = series["step"]
    gaps = np.diff(steps, axis=1)
    with np.errstate(all="ignore"):
        spacing = np.nanmedian(np.where(gaps > 0, gaps, np.nan), axis=1) if n_rows > 1 else np.ones(n_runs)
    spacing = np.where(np.isfinite(spacing), spacing, 1.0)
    first = df.groupby(codes, sort=False).head(1)
    tenants = list(first["tenant"].astype(str)) if "tenant" in df.columns else [None] * n_runs
    labels = list(first["label"].astype(int)) if "label" in df.columns else [None] * n_runs
    return [str(r) for r in run_ids], series, spacing, tenants, labels


def register(app: typer.Typer) -> None:
    @app.command("health")
    def health_cmd(
        trace: Path = typer.Argument(
            ..., help="trace CSV: run_id, step, eval_score [, reward, kl, entropy, grad_norm, response_len, "
            "truncation_rate, unparseable_rate, gpu_seconds, staleness, reward_std, group_flat_frac, "
            "group_reward_std, tenant, label]; rows in any order"
        ),
        alerts: Path = typer.Option(
            None, "--alerts", help="thresholds YAML (default: configs/alerts.yaml in the repository)"
        ),
        out: Path = typer.Option(
            None, "--out", help="alerts CSV: run_id, alert, severity, fired_step, detail "
            "(default: <TRACE>.alerts.csv beside the trace)"
        ),
        only: str = typer.Option(
            None, "--only", help="comma-separated alert names to run (default: every configured alert)"
        ),
        algorithm: str = typer.Option(
            None, "--algorithm", help="algorithm of the runs (ppo, grpo, rloo, ...): selects per-algorithm "
            "thresholds and demotions from the thresholds file, and skips the alerts that do not apply to it "
            "(no critic alert on grpo/rloo, no group alert on ppo)"
        ),
        details: int = typer.Option(
            2000, "--details", help="explain at most this many firings in the detail column (each is a "
            "streaming replay of one run); the rest say where they fired"
        ),
        metrics_file: Path = typer.Option(
            None, "--metrics-file", help="also write Prometheus text exposition (alert counters) here"
        ),
    ) -> None:
        """Run the run-health alert catalog over every run of a trace; write an alerts CSV; print a table."""
        import pandas as pd
        from rich.table import Table

        from common.validate import check_out_file
        from eval.health import ALGORITHM_HAS, Catalog, load_alerts_config, replay_alert
        from eval.registry import ALERTS
        from eval.traces import load_trace
        from rlhfops.console import make_console

        config = load_alerts_config(alerts)
        names = list(config.alerts)
        if only:
            from rlhfops.commands.args import comma_list

            names = comma_list(only)
            if not names:
                raise BadInput(f"--only: '{only}' names no alert (choose from: {', '.join(ALERTS)})")
            for n in names:
                if n not in ALERTS:
                    raise BadInput(f"--only: unknown alert '{n}' (choose from: {', '.join(ALERTS)})")
                if n not in config.alerts:
                    where = alerts or "configs/alerts.yaml"
                    raise BadInput(f"--only: alert '{n}' is not configured in {where}")
        if details < 0:
            raise BadInput("--details: must be >= 0")
        check_out_file(out or trace.with_name(trace.stem + ".alerts.csv"), "out")
        check_out_file(metrics_file, "metrics_file")
        source = str(alerts or "configs/alerts.yaml")
        if algorithm is not None:
            known = sorted({a for c in config.alerts.values() for a in (*c.params_by_algorithm, *c.demote.algorithms)}
                           | set(ALGORITHM_HAS))
            if algorithm not in known:
                # a typo would silently fall back to the default thresholds
                raise BadInput(f"algorithm: '{algorithm}' has no thresholds or demotions in {source} (known: "
                               f"{', '.join(known)}; leave it unset for the default thresholds)")
        catalog = Catalog.from_config(config, algorithm=algorithm, source=source)
        df = load_trace(trace)  # validates every column the catalog reads, EXTRA_COLUMNS included
        run_ids, series, spacing, tenants, labels = trace_to_series(df)

        present = {k for k, v in series.items() if not np.isnan(v).all()}
        skipped: dict[str, str] = {}
        runnable = []
        for n in names:
            needs = ALERTS[n].needs
            if n in catalog.not_evaluated:  # does not apply to --algorithm ("not evaluated: no critic")
                skipped[n] = catalog.not_evaluated[n]
                continue
            if n == "rollout_drift":
                missing = [] if present & {"response_len", "truncation_rate", "unparseable_rate"} else [
                    "response_len|truncation_rate|unparseable_rate"]
            else:
                missing = [c for c in needs if c not in present]
            if missing:
                skipped[n] = f"needs column {', '.join(missing)}"
            else:
                runnable.append(n)

        first = {n: np.full(len(run_ids), -1, dtype=np.int64) for n in runnable}
        rounded = np.round(spacing, 6)
        for d in np.unique(rounded):
            rows = np.flatnonzero(rounded == d)
            sub = {k: v[rows] for k, v in series.items()}
            scanned = catalog.at_spacing(float(d)).scan(sub, only=runnable)
            for n in runnable:
                first[n][rows] = scanned[n]

        records = []
        explained = 0
        for n in runnable:
            for r in np.flatnonzero(first[n] >= 0):
                idx = int(first[n][r])
                step = float(series["step"][r, idx])
                if explained < details:
                    alert = catalog.alerts[n].at_spacing(float(rounded[r]))
                    _, detail = replay_alert(alert, {k: v[r] for k, v in series.items()})
                    explained += 1
                else:
                    detail = f"fired at step {step:g} (raise --details to explain)"
                records.append({
                    "run_id": run_ids[r], "alert": n, "severity": catalog.severity(n, tenants[r]),
                    "fired_step": step, "detail": detail,
                })
        result = pd.DataFrame(records, columns=ALERT_COLUMNS)
        if not result.empty:
            result = result.sort_values(["run_id", "fired_step", "alert"], kind="stable")
        out = out or trace.with_name(trace.stem + ".alerts.csv")
        out.parent.mkdir(parents=True, exist_ok=True)
        result.to_csv(out, index=False)

        console = make_console()
        labelled = labels[0] is not None
        lab = np.array([x if x is not None else -1 for x in labels])
        table = Table(title=f"run health: {len(run_ids)} runs from {trace} (thresholds v{config.version})")
        for col in ("alert", "severity", "runs fired", "first fire (median step)"):
            table.add_column(col, justify="left" if col in ("alert", "severity") else "right")
        if labelled:
            table.add_column("fired | label 0 (FPR)", justify="right")
            table.add_column("fired | label 1", justify="right")
        for n in names:
            sev = config.alerts[n].severity
            if n in skipped:
                table.add_row(n, sev, "skipped", skipped[n], *([""] * (2 if labelled else 0)))
                continue
            fired = first[n] >= 0
            steps = [float(series["step"][r, first[n][r]]) for r in np.flatnonzero(fired)]
            med = f"{np.median(steps):g}" if steps else "-"
            row = [n, sev, f"{int(fired.sum())}/{len(run_ids)}", med]
            if labelled:
                for value in (0, 1):
                    k = lab == value
                    rate = f"{fired[k].mean():.3f} ({int(fired[k].sum())}/{int(k.sum())})"
                    row.append(rate if k.any() else "-")
            table.add_row(*row)
        console.print(table)
        paging = result["severity"] == "paging"
        paging_runs = result.loc[paging, "run_id"].nunique() if not result.empty else 0
        console.print(f"{paging_runs} of {len(run_ids)} runs raised a paging alert; alerts written to {out}")

        if metrics_file is not None:
            from eval.health import AlertEvent
            from infra.metrics import PlatformMetrics

            metrics = PlatformMetrics()
            for rec in records:
                event = AlertEvent(rec["alert"], rec["severity"], "", rec["fired_step"], 0, "", "", "")
                metrics.observe_alert(event)
            console.print(f"Prometheus exposition written to {metrics.write(metrics_file)}")
