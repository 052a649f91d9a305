"""Harnesses that the benchmarks (`scripts/bench_*.py`) and their tests drive, kept out of the
product's Ray drivers: `envs`, the environment core against real sandboxed environment processes."""
