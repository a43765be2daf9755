"""`rlhfops promote SOURCE [--to MODEL]`: move a model's `best` alias to a registered version, through the paired
test on the same prompts (`eval/promotion.py`), never by hand."""

from __future__ import annotations

import math

import typer

from common.errors import BadInput


def register(app: typer.Typer) -> None:
    @app.command("promote")
    def promote_cmd(
        source: str = typer.Argument(..., help="the version to promote: models:/NAME/VERSION or models:/NAME@ALIAS "
                                     "(a sweep's trial: models:/<sweep>-sweep@best)"),
        to: str = typer.Option(None, "--to", help="the model whose best alias it should take (e.g. acme-policy); "
                               "default: its own model"),
        alpha: float = typer.Option(0.02, "--alpha", help="level of the paired test: the chance of promoting a "
                                    "version that is truly no better than the holder"),
        margin: float = typer.Option(0.0, "--margin", help="how much better (held-out score units) it must be"),
    ) -> None:
        """Promote a registered version to a model's best alias only if it beats the current best by the paired test
        on the same held-out prompts and gate (else keep it, or refuse when the prompts or gate differ); the
        decision and its evidence are recorded as version tags. Exit 0 promoted, 1 not promoted, 2 bad input."""
        if not 0 < alpha < 1:
            raise BadInput(f"alpha: {alpha} must be in (0, 1)")
        if not math.isfinite(margin):
            raise BadInput(f"margin: {margin} must be a finite number")
        from infra import tracking as T
        from infra.promotion import copy_version, promote, resolve_version

        T.init_store()
        c = T.client()
        try:
            model, version = resolve_version(c, source)
        except ValueError as err:
            raise BadInput(f"source: {err}") from None
        target = to or model
        if to and to != model:
            version = copy_version(c, model, version, target, tenant=(version.tags or {}).get("tenant", ""))
        decision = promote(c, target, version, alpha=alpha, margin=margin)
        typer.echo(f"{target} version {version.version} (from {source}): {decision.reason}")
        if not decision.promote:
            raise typer.Exit(1)
