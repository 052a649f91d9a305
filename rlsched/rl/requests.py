"""From training problems to generation requests: one group of samples per prompt.

Shared by the single-process loop and the Ray controller so that both ask for exactly the same
samples: `group_size` requests per problem, ids `PREFIX-PROBLEM-MEMBER`, sampling knobs from the
config and the template's stop tokens.
"""

from __future__ import annotations

from collections.abc import Sequence

from rlsched.config import SamplingConfig
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
) -> tuple[list[GenerationRequest], dict[RequestId, TaskProblem]]:
    """The requests, in problem-major order, and which problem each one answers."""
    prompts = tokenizer.encode_batch([p.prompt(template) for p in problems])
    requests = [
        GenerationRequest(RequestId(f"{prefix}-{i}-{k}"), tuple(prompts[i]), params)
        for i in range(len(problems))
        for k in range(group_size)
    ]
    return requests, {r.request_id: problems[n // group_size] for n, r in enumerate(requests)}
