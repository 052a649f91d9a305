"""A scenario's jobs simulated together (`simulate`): one verifier pool (a CPU stage, and a GPU stage
where a job verifies on GPUs) shared by every job, each job driven by the one driver of the iteration
core (`rlsched.sim.rljob.SimJob`, sync or async), on one simulator clock.
"""

from __future__ import annotations

from operator import attrgetter

from rlsched.policy.verify import DispatchPolicy
from rlsched.sim.engine import Simulator
from rlsched.sim.rljob import PoolStage, SimJob, SimRun
from rlsched.sim.scenario import ScenarioConfig


def simulate(scenario: ScenarioConfig, seed: int, policy: DispatchPolicy | None = None) -> SimRun:
    """One run of every job of the scenario, under `policy` (default: the scenario's first)."""
    policy = policy or scenario.policies[0]
    sim = Simulator(seed)
    run = SimRun()
    pool = scenario.pool
    stages = {"cpu": PoolStage("cpu", pool.cpu_workers, sim, policy, pool, run.spans)}
    if pool.gpu_workers:
        stages["gpu"] = PoolStage("gpu", pool.gpu_workers, sim, policy, pool, run.spans)
    jobs = []
    for cfg in scenario.jobs:
        gpu = stages["gpu"] if cfg.verify_gpu_s is not None else None
        job = SimJob(cfg, sim, run, stages["cpu"], gpu)
        jobs.append(job)
        for stage in (stages["cpu"], gpu):
            if stage is not None:
                stage.jobs.append(job)
        sim.at(0.0, job.start)
    run.events = sim.run()
    run.decisions = sim.decisions
    end = max(map(attrgetter("end"), run.spans), default=0.0)
    for job in jobs:
        if job.cfg.weights is not None or job.cfg.transient:  # an elastic job: each instance's life
            run.instances.update(job.fleet.lives(end))
        run.resumed += job.fleet.resumed
        if job.staleness:
            run.dropped[job.name], run.staleness[job.name] = job.dropped, dict(sorted(job.staleness.items()))
        run.restarted += job.fleet.restarted
    for name, stage in stages.items():
        stage.close(end)
        run.busy_s[name] = stage.busy_s
        run.worker_s[name] = stage.worker_s
    return run
