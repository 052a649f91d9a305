"""`rlsched status` as printed: job states and reasons are text, never rich markup."""

from __future__ import annotations

from rlsched.cli_cluster import console, print_status


def test_status_keeps_bracketed_states_and_reasons() -> None:
    node = {"name": "h100-node", "capacity": {"CPU": 2.0, "H100": 2.0}, "free": {"CPU": 0.0, "H100": 0.0}}
    running = {"state": "running", "queue": "research", "priority": "low", "nodes": ["h100-node"]}
    pending = {"state": "pending", "queue": "research", "priority": "high", "nodes": []}
    status = {
        "cycles": 3,
        "error": "",
        "nodes": [node],
        "jobs": {
            "shared": running | {"elastic": 1, "reason": ""},
            "eval[2]": pending | {"elastic": 0, "reason": "needs {A100: 1} [bold]"},
            "flaky": pending
            | {
                "state": "parked",
                "elastic": 0,
                "reason": "parked after 6 failures (the last: exit status 1)",
                "requeues": 5,
                "failures": 6,
            },
        },
    }
    with console.capture() as out:
        print_status(status)
    text = out.get()
    assert "job shared [running] queue research low on h100-node; elastic 1" in text
    assert "job eval[2] [pending] queue research high: needs {A100: 1} [bold]" in text
    assert "job flaky [parked] queue research high; requeued 5x (6 failures): parked after 6 failures" in text
    assert "node h100-node: free 0/2 CPU, 0/2 H100" in text
