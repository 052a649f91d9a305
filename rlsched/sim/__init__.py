"""The simulator: the runtime's pure policies driven in virtual time, at scales this machine cannot host.

Imports `rlsched.policy`, the stdlib-only span schema of `rlsched.metrics`, the scenario tree of
`rlsched.config` (pydantic), and numpy; never Ray, torch or gRPC.
"""
