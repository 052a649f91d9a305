"""Agent environments: what an episode's tool calls act on (issue 23; docs/environments.md).

`protocol.py` says what an environment is; `sandboxed.py` runs an episode's tools in one hardened
sandbox of its own (`verifiers.sandbox`), kept for the episode and destroyed with it.
"""
