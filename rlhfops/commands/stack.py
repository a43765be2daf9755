"""`rlhfops stack up|down|env|status`: the production-like local stack (PostgreSQL, a Prefect server and an MLflow
server on it, the sweep's Optuna database) under one directory, on loopback (infra/stack.py)."""

from __future__ import annotations

import os
from pathlib import Path

import typer

DEFAULT_DIR = ".stack"


def stack_dir(path: Path | None) -> Path:
    return Path(path or os.environ.get("RLHFOPS_STACK_DIR") or DEFAULT_DIR).resolve()


def exports(env: dict[str, str]) -> str:
    import shlex

    return "\n".join(f"export {k}={shlex.quote(v)}" for k, v in env.items())


def register(app: typer.Typer) -> None:
    stack_app = typer.Typer(help="A local PostgreSQL-backed stack: Prefect server, MLflow server, Optuna storage.",
                            no_args_is_help=True)
    app.add_typer(stack_app, name="stack")
    dir_opt = typer.Option(None, "--dir", help="the stack's directory (default: $RLHFOPS_STACK_DIR or "
                           f"./{DEFAULT_DIR})")

    @stack_app.command("up")
    def up_cmd(
        dir: Path = dir_opt,  # noqa: A002 - the option's name
        pg_port: int = typer.Option(15432, "--pg-port", help="PostgreSQL port on 127.0.0.1"),
        prefect_port: int = typer.Option(14200, "--prefect-port", help="Prefect server port on 127.0.0.1"),
        mlflow_port: int = typer.Option(15000, "--mlflow-port", help="MLflow server port on 127.0.0.1"),
        mlflow_workers: int = typer.Option(2, "--mlflow-workers", help="MLflow server worker processes"),
        timeout_s: float = typer.Option(300.0, "--timeout", help="seconds to wait for each server to answer"),
    ) -> None:
        """Start PostgreSQL, then Prefect and MLflow on it; print the variables to export."""
        from infra import stack as S

        cfg = S.StackConfig(stack_dir(dir), pg_port=pg_port, prefect_port=prefect_port, mlflow_port=mlflow_port,
                            mlflow_workers=mlflow_workers)
        try:
            state = S.up(cfg, timeout_s=timeout_s, log=typer.echo)
        except S.StackError as err:
            typer.echo(f"error: stack up failed (everything it started is stopped): {err}", err=True)
            raise typer.Exit(1) from None
        typer.echo(f"stack up in {state['up_s']:.0f} s; data, logs and artifacts in {cfg.root}")
        typer.echo(f"to use it:  eval \"$(rlhfops stack env --dir {cfg.root})\"")
        typer.echo(exports(cfg.env()))

    @stack_app.command("down")
    def down_cmd(dir: Path = dir_opt) -> None:  # noqa: A002
        """Stop MLflow, Prefect and PostgreSQL; fail (exit 1) if any of their processes is left."""
        from infra import stack as S

        try:
            S.down(stack_dir(dir), log=typer.echo)
        except S.StackError as err:
            typer.echo(f"error: {err}", err=True)
            raise typer.Exit(1) from None
        typer.echo("stack down: no process left")

    @stack_app.command("env")
    def env_cmd(dir: Path = dir_opt) -> None:  # noqa: A002
        """Print the exports that point the CLI, flows, deployments, workers and sweeps at the stack."""
        from common.errors import BadInput
        from infra import stack as S

        root = stack_dir(dir)
        if not S.read_state(root):
            raise BadInput(f"--dir: no stack recorded in {root}; start one with `rlhfops stack up --dir {root}`")
        typer.echo(exports(S.StackConfig.load(root).env()))

    @stack_app.command("status")
    def status_cmd(dir: Path = dir_opt) -> None:  # noqa: A002
        """Each service: alive, answering; exit 1 unless all three answer."""
        from infra import stack as S

        root = stack_dir(dir)
        st = S.status(root)
        if not st:
            typer.echo(f"no stack recorded in {root}")
            raise typer.Exit(1)
        cfg = S.StackConfig.load(root)
        where = {"postgres": cfg.db_url("postgres"), "prefect": cfg.prefect_api_url, "mlflow": cfg.mlflow_url}
        for name, s in st.items():
            state = "up" if s["answers"] else ("not answering" if s["alive"] else "down")
            typer.echo(f"{name:9s} {state:14s} {where[name]}")
        if not all(s["answers"] for s in st.values()):
            raise typer.Exit(1)
