"""The exceptions a user may see: bad input, named and explained, and a training group's faults.

`UserError` carries a paragraph that says what is wrong and how to fix it. The CLI prints it and
exits with status 2. `TrainingFault` says which training ranks died or stopped answering in a step
(`CollectiveFault` is what one rank saw); the CLI prints it and exits with status 1. Everything
else that escapes is a bug and keeps its traceback.
"""


class UserError(Exception):
    """Bad input from the user (config, files, arguments). The message is shown as is."""


class CollectiveFault(RuntimeError):
    """A training rank's collective failed: a peer died, or did not answer within
    `trainer.collective_timeout_s`. Raised in the rank that saw it."""

    def __init__(self, rank: int, what: str, detail: str) -> None:
        super().__init__(rank, what, detail)  # the args rebuild it when Ray carries it across
        self.rank, self.what, self.detail = rank, what, detail

    def __str__(self) -> str:
        return f"rank {self.rank} failed in {self.what}: {self.detail}"


class TrainingFault(RuntimeError):
    """A training step failed because ranks died, stopped answering or faulted; it names them."""

    def __init__(
        self, step: str, dead: tuple[int, ...], stuck: tuple[int, ...], faults: tuple[str, ...]
    ) -> None:
        super().__init__(step, dead, stuck, faults)
        self.step, self.dead, self.stuck, self.faults = step, dead, stuck, faults

    def __str__(self) -> str:
        parts = []
        if self.dead:
            parts.append(f"rank(s) {', '.join(map(str, self.dead))} died")
        if self.stuck:
            parts.append(f"rank(s) {', '.join(map(str, self.stuck))} did not answer")
        parts.extend(self.faults)
        return f"the training group's {self.step} failed: " + "; ".join(parts)
