"""Fixtures the trainer-level tests share."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """A warm-start cache (SFT'd base policy, proxy reward model) shared by one test module's tiny runs."""
    return tmp_path_factory.mktemp("cache")
