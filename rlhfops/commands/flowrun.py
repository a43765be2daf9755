"""Running a Prefect flow from the CLI (`rlhfops nightly`, `rlhfops platform`): settings for a local run, the
Prefect API reached in the background while the command imports the flows, a progress bar while the flow runs,
and a failed run reported in one line."""

from __future__ import annotations

import os
import threading
from contextlib import nullcontext
from typing import Any

import typer

from common.errors import BadInput


def prefect_env(verbose: bool = False) -> None:
    """Settings for a local run; must happen before Prefect is imported. Explicit user settings win."""
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    # the temporary server takes 10-18 s to start on 2 loaded cores; Prefect's default gives up at 20 s
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
    # The temporary server (a subprocess with this environment) records task runs and events from our events in
    # its SQLite: by default one transaction per task-run event and one per 20 events. Each commit can land between
    # the read and the write of an API request (creating a subflow's flow run, say), which then fails with
    # "database is locked"; the server answers 503 and Prefect's client retries after ~2 s. Batches of 100 task-run
    # events and 200 events (or whatever arrived within the 5-s flush interval) made those clashes rare (measured:
    # slow requests per nightly matrix 2-7 -> 0-1). A server started with `prefect server start` keeps its own
    # settings.
    os.environ.setdefault("PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_BATCH_SIZE", "100")
    os.environ.setdefault("PREFECT_SERVER_SERVICES_EVENT_PERSISTER_BATCH_SIZE", "200")
    if not verbose:
        os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")


class start_prefect_api(threading.Thread):  # noqa: N801 - used like a function
    """Start (or reach) the Prefect API in the background while the CLI imports the flows and opens the
    MLflow store: the temporary server's 10-18 s start then overlaps that work instead of adding to it."""

    def __init__(self) -> None:
        super().__init__(daemon=True, name="prefect-api-start")
        self.error: BaseException | None = None
        self.start()

    def run(self) -> None:
        try:
            from prefect.client.orchestration import get_client

            from infra.provision import own_temporary_server, wait_for_api
            from infra.tracking import orm_import_guard

            with orm_import_guard():  # imports Prefect's server (ORM classes) while the CLI opens the MLflow store
                own_temporary_server()  # a temporary server, if one starts, dies with this process (even on kill -9)
            # a configured server that is restarting: wait it out (a nightly started then exited 1 at once); returns
            # at once on the temporary server and on one that answers
            wait_for_api(budget_s=START_API_WAIT_S)
            with get_client(sync_client=True) as client:
                client.hello()
        except BaseException as err:  # noqa: BLE001 - reported by the caller
            self.error = err


#: how long a command waits at start for a configured Prefect API that does not answer (a server restart)
START_API_WAIT_S = 120.0


def on_temporary_server() -> bool:
    """True when no Prefect API is configured: flows run on the temporary server this process starts."""
    from prefect.settings import get_current_settings

    return not get_current_settings().api.url


def run_flow(console, flow_obj, what: str, server: start_prefect_api | None = None, **params: Any) -> Any:
    """`flow_obj(**params)` under a progress bar (one bar per stage the flow reports); returns the flow's result.

    `server`: wait for the background API start first (exit 1 with one line if it failed). On the temporary
    server, which stops with this process, the flow run sends no heartbeats: nothing could ever read a missed one,
    and its exit would wait up to a second for the heartbeat thread. A failed run: bad input propagates (exit 2,
    one line naming the field); any other failure is printed as one line (`<what> failed: ...`), exit 1."""
    from flows import progress as flow_progress
    from infra.provision import no_heartbeats
    from rlhfops.console import progress

    if server is not None:
        server.join()
        if server.error is not None:
            console.print(f"[red]Prefect API not reachable[/red]: {server.error}")
            raise typer.Exit(1)
    if not on_temporary_server():
        from infra.provision import APIUnreachable, wait_for_api

        try:  # the server may have gone down since the start: the flow's first request would fail at once
            wait_for_api(budget_s=START_API_WAIT_S)
        except APIUnreachable as err:
            console.print(f"[red]Prefect API not reachable[/red]: {err}")
            raise typer.Exit(1) from None
    # a terminal gets bars; a pipe or a file (cron, nohup, CI) a plain line per stage, as it happens
    with progress(console) as shown, (no_heartbeats() if on_temporary_server() else nullcontext()):
        flow_progress.install(shown)
        try:
            state = flow_obj(**params, return_state=True)
        finally:
            flow_progress.install(None)
    if state.is_failed():
        try:
            state.result()
        except BadInput:
            raise
        except Exception as err:  # noqa: BLE001 - report the failure in one line, exit 1
            console.print(f"[red]{what} failed[/red]: {type(err).__name__}: {err}")
        raise typer.Exit(1)
    return state.result()
