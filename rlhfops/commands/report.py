"""`rlhfops report`: tonight's nightly against the one before, from MLflow (`mlflow.search_runs`)."""

from __future__ import annotations

import math
from pathlib import Path

import typer

from common.errors import BadInput

METRICS = ("jct_mean", "wasted_frac", "saved_frac", "precision", "recall", "fpr", "jain", "ttfuc_mean")


def _fmt(x) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "—"
    return f"{x:,.0f}" if abs(x) >= 1000 else f"{x:.4g}"


def register(app: typer.Typer) -> None:
    @app.command("report")
    def report_cmd(
        run: str = typer.Option(None, "--run", help="the nightly's MLflow run id to report (default: the newest "
                                "finished nightly)"),
        metrics: str = typer.Option("jct_mean,wasted_frac,precision,recall", "--metrics",
                                    help=f"comma-separated scheduler metrics to compare (from: {', '.join(METRICS)})"),
        experiment: str = typer.Option(None, "--experiment", help="only this simulation experiment, e.g. E2"),
        mlflow_experiment: str = typer.Option("rlhfops", "--mlflow-experiment", help="MLflow experiment name"),
        out: Path = typer.Option(None, "--out", help="also write the report as markdown here"),
    ) -> None:
        """Compare tonight's nightly with the previous one: per scheduler (simulation matrix: tonight, last,
        delta) and per tenant and training algorithm (live jobs: cost, GPU-hours, steps, best held-out score; a
        tenant's PPO and GRPO jobs are compared each with its own kind), and whether tonight's job version took the
        registry's best alias (a refusal for a changed gate names the part that changed). Reads the MLflow store
        (MLFLOW_TRACKING_URI, default sqlite:///mlflow.db in the working directory)."""
        from rich.table import Table

        from infra import tracking as T
        from infra.reporting import nightly_report, promotion_lines, report_markdown
        from rlhfops.commands.args import comma_list
        from rlhfops.console import make_console

        chosen = tuple(comma_list(metrics))
        for m in chosen:
            if m not in METRICS:
                raise BadInput(f"--metrics: unknown metric '{m}' (choose from: {', '.join(METRICS)})")
        if not chosen:
            raise BadInput("--metrics: name at least one metric")
        from common.validate import check_out_file

        check_out_file(out, "out")
        console = make_console()
        rep = nightly_report(mlflow_experiment, tonight_id=run)
        if rep["tonight"] is None:
            if run:
                raise BadInput(f"--run: no nightly run '{run}' in MLflow experiment '{mlflow_experiment}'")
            console.print(f"No nightly in {T.tracking_uri()} yet: run `rlhfops nightly --quick` first.")
            raise typer.Exit(1)
        if experiment:
            s = rep["schedulers"]
            rep["schedulers"] = s[s.experiment.str.upper() == experiment.upper()]
        last = rep["last"]
        console.print(f"tonight: run {rep['tonight'].run_id} ({rep['tonight']['start_time']:%Y-%m-%d %H:%M}); "
                      + (f"last: run {last.run_id} ({last['start_time']:%Y-%m-%d %H:%M})" if last is not None
                         else "no earlier nightly: the 'last' columns are empty"))
        s = rep["schedulers"]
        if not s.empty:
            table = Table(title="Schedulers (simulation matrix): tonight / last / Δ", title_justify="left")
            for col in ("experiment", "variant", "scheduler"):
                table.add_column(col)
            for m in chosen:
                table.add_column(m, justify="right")
            wide = s[s.metric.isin(chosen)].pivot_table(index=["experiment", "variant", "scheduler"],
                                                        columns="metric", values=["tonight", "last", "delta"],
                                                        aggfunc="first", sort=False)
            for idx, row in wide.iterrows():
                cells = [f"{_fmt(row.get(('tonight', m)))} / {_fmt(row.get(('last', m)))} / "
                         f"{_fmt(row.get(('delta', m)))}" for m in chosen]
                table.add_row(*map(str, idx), *cells)
            console.print(table)
        ten = rep["tenants"]
        if not ten.empty:
            table = Table(title="Tenants (live jobs)", title_justify="left")
            for col in ("tenant", "algorithm", "metric", "tonight", "last", "Δ"):
                table.add_column(col, justify="left" if col in ("tenant", "algorithm", "metric") else "right")
            for _, r in ten.iterrows():
                table.add_row(r.tenant, r.algorithm, r.metric, _fmt(r.tonight), _fmt(r["last"]), _fmt(r.delta))
            console.print(table)
        for line in promotion_lines(rep.get("promotions")):  # did tonight's job take `best`, and if not, why
            console.print(line.replace("## ", ""), markup=False, highlight=False)
        if out is not None:
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(report_markdown(rep, chosen))
            console.print(f"[green]wrote {out}[/green]")
