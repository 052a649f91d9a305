"""Ray actors, one module per kind (trainer group, rollout instance, verifier pool, controller).

Thin by design: they hold state and call components and policies. The first ones arrive with the
Ray job; until then `rlsched run` drives the same components in one process (`rlsched.rl.loop`).
"""
