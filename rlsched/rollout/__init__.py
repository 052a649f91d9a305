"""A rollout instance's engine-side logic, Ray-free: `instance.Instance`, which `actors.rollout` runs
as an actor."""
