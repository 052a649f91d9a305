"""Ray's token authentication, for a process that joins a cluster someone else started.

Ray 2.60 clusters started with `ray start` (and `ray.init()`) authenticate every client with a
token, kept in `~/.ray/auth_token` (or `RAY_AUTH_TOKEN_PATH`, or `RAY_AUTH_TOKEN`). A client that
joins an existing cluster sends it only in `RAY_AUTH_MODE=token`, and without it the connection is
refused with "Authentication token is missing", which `ray.init` reports as no cluster at all. So
before joining, a process that finds a token and has no mode set asks for token mode; a user's own
`RAY_AUTH_MODE` always wins. Ray reads the mode when it is imported: `rlsched.cli.main` calls this
first, for every command given `--address`.
"""

from __future__ import annotations

import os
from pathlib import Path


def use_cluster_token() -> bool:
    """Set `RAY_AUTH_MODE=token` when a token is at hand and no mode was chosen; whether it did."""
    if "RAY_AUTH_MODE" in os.environ:
        return False
    path = Path(os.environ.get("RAY_AUTH_TOKEN_PATH") or Path.home() / ".ray" / "auth_token")
    if os.environ.get("RAY_AUTH_TOKEN") or path.is_file():
        os.environ["RAY_AUTH_MODE"] = "token"
        return True
    return False
