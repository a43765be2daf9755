"""A Prefect server whose concurrency-limit calls fail for a while, as the real one fails: every request this process's
Prefect clients send to a path under `/v2/concurrency_limits` gets, until a deadline, the answer the server gives
under that fault; the rest of the client (its own retries, `raise_for_status`, the concurrency service's error
wrapping) is Prefect's own. Installed in the httpx transports, below every Prefect client, so it works in any
process that installs it (the cross-process tests start their holders with `holder`)."""

from __future__ import annotations

import re
import time
from typing import Any

#: what the server answers (prefect/server/api/server.py `custom_internal_exception_handler`): an unhandled error is
#: a 500; SQLite's "database is locked" (`is_client_retryable_exception`) a 503, which the client retries itself
ANSWERS = {"500": (500, {"exception_message": "Internal Server Error"}),
           "locked": (503, {"exception_message": "Service Unavailable"})}
LIMIT_PATHS = r"/v2/concurrency_limits"
ACQUIRE_PATH = r"/v2/concurrency_limits/increment-with-lease"

#: the fault in force in this process: answer, path pattern, deadline (time.time()) or a duration counted from the
#: first request it answers (`for_s`; `first`: when that was), requests answered so far
state: dict[str, Any] = {"answer": None, "path": None, "until": 0.0, "for_s": None, "first": None, "faulted": 0}


def _faulted(request) -> Any:
    import httpx

    if state["answer"] is None or not re.search(state["path"], request.url.path):
        return None
    now = time.time()
    if state["for_s"] is not None and state["first"] is None:
        state.update(first=now, until=now + state["for_s"])
    if now >= state["until"]:
        return None
    state["faulted"] += 1
    code, body = ANSWERS[state["answer"]]
    return httpx.Response(code, json=body, request=request)


def install(answer: str, until: float = 0.0, path: str = LIMIT_PATHS, for_s: float | None = None) -> None:
    """From now until `until` (time.time(), so a deadline means the same in every process), or for `for_s` seconds
    from the first request it answers, requests to `path` (a regex on the URL path) are answered `answer` (a key of
    `ANSWERS`); `until=inf`: for good. Patches the httpx transports for the rest of the process (tests undo it with
    `patch_transports(monkeypatch)` instead)."""
    import httpx

    state.update(answer=answer, until=until, path=path, for_s=for_s, first=None, faulted=0)
    if getattr(httpx.HTTPTransport.handle_request, "_slot_fault", False):
        return
    sync_send, async_send = httpx.HTTPTransport.handle_request, httpx.AsyncHTTPTransport.handle_async_request

    def handle_request(self, request):
        return _faulted(request) or sync_send(self, request)

    async def handle_async_request(self, request):
        return _faulted(request) or await async_send(self, request)

    handle_request._slot_fault = handle_async_request._slot_fault = True
    httpx.HTTPTransport.handle_request = handle_request
    httpx.AsyncHTTPTransport.handle_async_request = handle_async_request


def patch_transports(monkeypatch, answer: str, until: float = 0.0, path: str = LIMIT_PATHS,
                     for_s: float | None = None) -> dict[str, Any]:
    """`install` for one test: the transports and the state are restored when it ends."""
    import httpx

    monkeypatch.setattr(httpx.HTTPTransport, "handle_request", httpx.HTTPTransport.handle_request)
    monkeypatch.setattr(httpx.AsyncHTTPTransport, "handle_async_request",
                        httpx.AsyncHTTPTransport.handle_async_request)
    monkeypatch.setitem(state, "answer", None)
    install(answer, until, path, for_s)
    return state


def holder(api_url: str, name: str, size: int, answer: str, for_s: float, wait_s: float, hold_s: float, together,
           results) -> None:
    """One process holding every slot of the limit `name` for `hold_s` seconds, against a server whose limit calls
    fail for `for_s` seconds from the first one; it starts when the others passed the barrier `together` too. Puts
    (pid, backend, start, end, faulted) when it held the slots, or (pid, "error", message, faulted) on `results`."""
    import os

    from prefect.settings import PREFECT_API_URL, PREFECT_CLIENT_MAX_RETRIES, temporary_settings

    from infra.provision import SlotPool

    install(answer, path=LIMIT_PATHS, for_s=for_s)
    try:
        with temporary_settings({PREFECT_API_URL: api_url, PREFECT_CLIENT_MAX_RETRIES: 0}):
            together.wait(timeout=120)
            pool = SlotPool(size, name, wait_s=wait_s)
            with pool.take(size):
                start = time.time()
                time.sleep(hold_s)
                end = time.time()
        results.put((os.getpid(), pool.backend, start, end, state["faulted"]))
    except Exception as err:  # noqa: BLE001 - the parent asserts on it
        results.put((os.getpid(), "error", f"{type(err).__name__}: {err}", state["faulted"]))
