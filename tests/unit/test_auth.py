"""Joining a Ray 2.60 cluster: token mode is asked for only when a token is at hand and the user
chose no mode."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from actors.auth import use_cluster_token


@pytest.fixture(autouse=True)
def _clean(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    for key in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    yield
    os.environ.pop("RAY_AUTH_MODE", None)  # set by the code, not by monkeypatch: never left behind


def test_a_token_file_asks_for_token_mode(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    token = tmp_path / "token"
    token.write_text("x" * 64)
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(token))
    assert use_cluster_token() and os.environ["RAY_AUTH_MODE"] == "token"


def test_no_token_changes_nothing() -> None:
    assert not use_cluster_token() and "RAY_AUTH_MODE" not in os.environ


def test_the_users_mode_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAY_AUTH_TOKEN", "abc")
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    assert not use_cluster_token() and os.environ["RAY_AUTH_MODE"] == "disabled"
