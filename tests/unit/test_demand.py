"""A job's demand, written once: each bundle from the config, and the actor options that ask Ray for
exactly that bundle (what a placement group's bundle of the same shape reserves)."""

from __future__ import annotations

from actors.demand import actor_options
from rlsched.config import load_config
from rlsched.config_params import instance_bundle, rank_bundle, worker_bundle


def test_each_bundle_carries_its_cpus_gpus_and_custom_resources() -> None:
    cfg = load_config(
        None,
        [
            "trainer.cpus_per_rank=2",
            "trainer.gpus_per_rank=1",
            'trainer.resources={"H100": 1}',
            "rollout.cpus_per_instance=3",
            'rollout.resources={"L4": 1}',
            "verifier.cpus_per_worker=0.5",
        ],
    )
    assert rank_bundle(cfg.trainer) == {"CPU": 2.0, "GPU": 1.0, "H100": 1.0}
    assert instance_bundle(cfg.rollout) == {"CPU": 3.0, "L4": 1.0}
    assert worker_bundle(cfg.verifier) == {"CPU": 0.5}
    assert worker_bundle(cfg.verifier, gpu=True) == {"CPU": 1.0, "GPU": 1.0}
    assert "GPU" not in rank_bundle(load_config(None, []).trainer)


def test_actor_options_ask_for_the_bundle_itself() -> None:
    assert actor_options({"CPU": 2.0, "GPU": 1.0, "H100": 1.0}) == {
        "num_cpus": 2.0,
        "num_gpus": 1.0,
        "resources": {"H100": 1.0},
    }
    assert actor_options({"CPU": 0.5}) == {"num_cpus": 0.5, "num_gpus": 0.0}
