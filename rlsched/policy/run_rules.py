"""A job's run rules, decided here and nowhere else: when the job stops (its step limit and training
time budget), when the held-out evaluation runs, when a checkpoint is due, and when an update must
wait for one. The Ray job's loop (`actors.job`), its iteration driver (`rlsched.job.iterations`), its
durability (`rlsched.job.durability`) and `--local` (`rlsched.rl.loop`) all ask these; the config makes
them once (`rlsched.config_params.run_rules`).
"""

from __future__ import annotations

from dataclasses import dataclass

from rlsched.policy.durability import checkpoint_due


@dataclass(frozen=True)
class RunRules:
    steps: int  # the job's iterations (GRPO steps), at most
    time_budget_s: float  # training seconds, at most: no iteration starts past it
    eval_every: int  # a held-out evaluation (of the curve's problems) after every n-th iteration
    checkpoint_every: int  # a checkpoint after every n-th committed iteration (0: only at the end)

    def out_of_time(self, train_s: float) -> bool:
        """The training seconds so far leave no room for another iteration."""
        return train_s > self.time_budget_s

    def eval_due(self, iteration: int) -> bool:
        """A held-out evaluation follows this committed iteration."""
        return iteration % self.eval_every == 0

    def checkpoint_due(self, iteration: int, last: bool = False) -> bool:
        """A checkpoint follows this committed iteration (the last one always has one)."""
        return checkpoint_due(iteration, self.checkpoint_every, last_iteration=last)

    def update_held(self, step: int, stopping: bool, asked: int) -> bool:
        """Whether step `step`'s update must wait: past the job's last step, the job means to stop, or
        a checkpoint is due after the step before and the job has not yet taken it (it has asked for
        step `asked` so far: a checkpoint holds the training state after its step, so the ranks must
        not step past it first)."""
        before = step - 1
        if stopping or step > self.steps:
            return True
        return self.checkpoint_due(before) and asked <= before
