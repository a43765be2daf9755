"""Command-line values the commands share, parsed in one place: comma-separated seeds and names."""

from __future__ import annotations

from common.errors import BadInput


def parse_seeds(text: str | None, flag: str = "--seeds") -> list[int] | None:
    """`--seeds 42,123`: the integers as typed (their range and repeats are the caller's to check); None for None.
    Anything else is BadInput naming `flag`."""
    if text is None:
        return None
    try:
        return [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise BadInput(f"{flag} '{text}': expected comma-separated integers, e.g. 42,123,456") from None


def comma_list(text: str) -> list[str]:
    """`--only a, b,,c`: the names, stripped, empty ones dropped (`['a', 'b', 'c']`)."""
    return [t.strip() for t in text.split(",") if t.strip()]
