"""Pure decisions: `decide(snapshot, now, params) -> decisions`, the same code in runtime and simulator.

Nothing here imports ray, torch, grpc, time, random, uuid or os: the clock, randomness and ids come in
as arguments, snapshots and decisions are frozen dataclasses, and an expected "no" is a value.
"""
