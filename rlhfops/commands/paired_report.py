"""`rlhfops paired-report`: the paired stop rule against the mean-only default on the per-prompt corpus."""

from __future__ import annotations

from pathlib import Path

import typer

from common.errors import BadInput


def register(app: typer.Typer) -> None:
    @app.command("paired-report")
    def paired_report_cmd(
        corpus: Path = typer.Option(Path("data/prompts"), "--corpus", help="the per-prompt corpus (one folder per "
                                    "part, each with traces.csv and its gate records)"),
        parts: str = typer.Option("tune,report,fresh", "--parts", help="comma-separated parts of the corpus"),
        budget: float = typer.Option(0.25, "--budget", help="extension budget per run, a fraction of the fixed "
                                     "gate's prompt evaluations (0 never extends)"),
        out: Path = typer.Option(None, "--out", help="markdown file whose paired-corpus section is replaced "
                                 "(e.g. docs/detectors.md)"),
    ) -> None:
        """Replay the per-prompt corpus through the paired rule (with the gate's extension batches) and the mean-only
        default on the same records: useful recall, false-stop rate (95% bounds), quality kept, delay, extra eval;
        prints the table and, with --out, writes it into that page."""
        from rlhfops.commands.args import comma_list

        names = comma_list(parts)
        if not names:
            raise BadInput("parts: name at least one part of the corpus, e.g. --parts tune,report")
        for part in names:
            if not (corpus / part / "traces.csv").is_file():
                raise BadInput(f"corpus: {corpus / part} has no traces.csv (parts: {', '.join(names)})")
        if not 0.0 <= budget <= 10.0:
            raise BadInput(f"budget: {budget} must be a fraction of the gate's prompt evaluations in 0..10")
        if out is not None:
            from common.validate import check_out_file

            check_out_file(out, "out")
        from studies.paired_report import report

        typer.echo(report(corpus, names, budget, out))
