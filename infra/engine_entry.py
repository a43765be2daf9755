"""`python -m infra.engine_entry`: Prefect's flow-run engine (`python -m prefect.engine`) once the Prefect API answers.

A process worker starts every flow run as `python -m prefect.engine`, whose first request (reading the flow run) goes
through a fresh client, and Prefect retries a refused connection only on a client that has connected before: a flow
run whose process starts while the server restarts exits 1 at once and is reported Crashed (`rlhfops bench platform
--restart-prefect-after`: 8 of 8 jobs, with 2 shared cores spending ~20 s importing before that first request).
Waiting for the health check first (`infra.provision.wait_for_api`: backoff up to 30 s, for up to 5 minutes) turns
such a restart into a pause. Set it as the process pool's command (`rlhfops bench platform` does; docs/stack.md)."""

from __future__ import annotations

import runpy


def main() -> None:
    from infra.provision import wait_for_api

    wait_for_api()
    runpy.run_module("prefect.engine", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
