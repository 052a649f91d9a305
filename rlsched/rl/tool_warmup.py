"""Teaching a model the tool-call format before reinforcement learning takes over.

A 135M instruct model does not call tools on its own: shown SmolLM2's tools template, it answers in
prose. So a multi-turn job starts from a short supervised warm-up on teacher episodes (as the toy's
base was pretrained on a noisy teacher): for a training problem, the teacher calls the calculator
with the problem's arithmetic, reads the result, and answers `\\boxed{RESULT}`. The episode is
tokenized as the in-job loop builds it (`rlsched.rl.agent`): the replies end with the template's
end-of-turn token, the observations and template text between them are rendered by the chat template
and tokenized apart, and the loss is on the replies only.

The warm-up is kept short on purpose (`steps`): the format is learned, reading the arithmetic off a
word problem is learned only in part, and reward does the rest. `scripts/warm_up_tools.py` writes the
result as a checkpoint, with the tools template as its chat template.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Sequence
from typing import Any

import torch

from environments.protocol import ToolSpec
from rlsched.config import Precision
from rlsched.model.precision import autocast
from rlsched.rl.agent import render
from rlsched.rl.batching import pack, sequence_logprobs
from rlsched.rl.task import TaskProblem
from rlsched.rl.word_problems import expression_of
from rlsched.serve.tools import CLOSE, OPEN

CALCULATOR = "calculator"


def teacher_episode(problem: TaskProblem, tool: str = CALCULATOR) -> list[dict[str, Any]]:
    """The conversation a teacher has on `problem`: one calculator call, its result, the answer."""
    expression = expression_of(str(getattr(problem, "id", "")))
    call = json.dumps({"name": tool, "arguments": {"expression": expression}})
    return [
        *(m.model_dump() for m in problem.messages()),
        {"role": "assistant", "content": f"{OPEN}\n{call}\n{CLOSE}"},
        {"role": "tool", "content": problem.answer, "tool_call_id": "call_0"},
        {"role": "assistant", "content": f"The answer is \\boxed{{{problem.answer}}}."},
    ]


def episode_tokens(
    tokenizer: Any, messages: list[dict[str, Any]], tools: Sequence[ToolSpec], end_id: int
) -> tuple[list[int], list[int], list[float]]:
    """(first prompt, the rest, loss mask over the rest): each assistant reply tokenized on its own
    and closed with `end_id`, everything between the replies rendered by the chat template."""
    replies = [k for k, m in enumerate(messages) if m["role"] == "assistant"]
    first = render(tokenizer, messages[: replies[0]], tools)
    prompt = first.encode(tokenizer)
    rest: list[int] = []
    mask: list[float] = []
    said = first.text
    for n, k in enumerate(replies):
        if n > 0:  # the observations and template text since the last reply
            rendered = render(tokenizer, messages[:k], tools)
            between = rendered.encode(tokenizer, len(said))
            rest += between
            mask += [0.0] * len(between)
            said = rendered.text
        reply = [*tokenizer.encode(messages[k]["content"]), end_id]
        rest += reply
        mask += [1.0] * len(reply)
        said += messages[k]["content"] + tokenizer.decode([end_id], skip_special_tokens=False)
    return prompt, rest, mask


def warm_up(
    model: Any,
    tokenizer: Any,
    problems: Sequence[TaskProblem],
    tools: Sequence[ToolSpec],
    end_id: int,
    *,
    steps: int = 30,
    batch: int = 8,
    lr: float = 2e-5,
    seed: int = 0,
    precision: Precision = Precision.AUTO,
    log: Callable[[str], None] = print,
) -> list[float]:
    """`steps` AdamW steps of cross-entropy on teacher episodes of `problems`; the losses."""
    rng = random.Random(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    losses = []
    model.train()
    for step in range(steps):
        rows = [
            episode_tokens(tokenizer, teacher_episode(p), tools, end_id)
            for p in rng.sample(list(problems), batch)
        ]
        packed = pack([r[0] for r in rows], [r[1] for r in rows], pad, masks=[r[2] for r in rows])
        with autocast(precision, "cpu"):
            logp = sequence_logprobs(model, packed)
        loss = -(logp * packed.loss_mask).sum() / packed.loss_mask.sum()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[no-untyped-call]
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(float(loss.detach()))
        if (step + 1) % 5 == 0 or step + 1 == steps:
            log(f"warm-up step {step + 1}/{steps}: loss {losses[-1]:.3f}")
    model.eval()
    return losses
