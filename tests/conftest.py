"""Shared fixtures. Layers: unit/ (pure, seconds), component/ (torch, files; no Ray), e2e/ (the CLI)."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def root() -> Path:
    return ROOT
