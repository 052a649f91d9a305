"""The state cores: each subsystem's state, lifecycles and rules, written once, in plain Python.

A core consumes typed events (something happened, at a time the driver read from its clock) and
returns typed effects (what the driver must now do). It calls the pure policies itself and never
reads a clock, sleeps, or touches Ray or a socket: the Ray runtime (`actors/`), the simulator
(`rlsched.sim`) and the in-process loop drive the same core, so what one decides the others decide.
"""
