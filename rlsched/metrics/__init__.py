"""Spans and the figures derived from them, for the runtime and the simulator alike."""
