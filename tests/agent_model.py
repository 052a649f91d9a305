"""SmolLM2 that calls the calculator, as the multi-turn tests need it: built once per checkout by the
`smollm2_tools` fixture (tests/conftest.py) and shared by `tests/component/test_agent_episodes.py`
and `tests/e2e/test_agent_ray.py`.

It is made in two parts. First the user's recipe, `scripts/warm_up_tools.py` (what `make
model-smollm2-calc` runs), for one step: the script runs end to end and writes a checkpoint the job
loads. Then twelve AdamW steps on four fixed teacher episodes: three calculator episodes
(`rlsched.rl.tool_warmup`) and one whose reply is a call that does not parse, so that greedy episodes
call the real calculator on those three problems and make the broken call when asked to. The
weights are kept in FP32, as trained, so the episode tests decode what the trained model decodes.
The tests' point is the mechanism (rounds, tools, resumption), not the recipe's quality: the
14-step warm-up's held-out results are in docs/environments.md.
"""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TEMPLATE = ROOT / "configs" / "chat_templates" / "smollm2_tools.jinja"
CALCULATOR = (ROOT / "configs" / "tools" / "calculator.py").read_text()
SCHEMA = {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}
BROKEN_PROMPT = "Call the calculator the wrong way, please."
BROKEN_REPLY = '<tool_call>\n{"name": "calculator", "arguments": \n</tool_call>'
STEPS, LR = 12, 6e-5

# what the model depends on besides the SmolLM2 import: a change to any of them builds it again
INPUTS = (
    "tests/agent_model.py",
    "scripts/warm_up_tools.py",
    "rlsched/rl/tool_warmup.py",
    "configs/jobs/agent_calc.yaml",
    "configs/chat_templates/smollm2_tools.jinja",
    "configs/tools/calculator.py",
)


def agent_cfg(program: str = CALCULATOR, timeout_s: float = 5.0, **limits: Any) -> Any:
    from rlsched.config_agent import AgentConfig

    tool = {"name": "calculator", "description": "Evaluate an arithmetic expression", "parameters": SCHEMA}
    return AgentConfig.model_validate(
        {"tools": [tool | {"program": program, "timeout_s": timeout_s}], **limits}
    )


def broken_problem() -> Any:
    from rlsched.model.template import Message
    from rlsched.rl.task import JsonlProblem

    return JsonlProblem("broken", (Message(role="user", content=BROKEN_PROMPT),), "0", "math")


def teacher_problems() -> list[Any]:
    """The three calculator problems the model is taught on (the first level, seed 0)."""
    from rlsched.rl.word_problems import LEVELS, draw_problem

    rng = random.Random(0)
    return [draw_problem(rng, LEVELS[next(iter(LEVELS))]) for _ in range(3)]


def build(smollm2: Path, out: Path) -> None:
    """The model, into `out` (see the module docstring)."""
    import shutil

    warm = out.with_name(out.name + "-warm")
    shutil.rmtree(warm, ignore_errors=True)
    command = [sys.executable, "scripts/warm_up_tools.py", "--checkpoint", str(smollm2), "--steps", "1",
               "--eval", "0", "--out", str(warm)]  # fmt: skip
    subprocess.run(command, check=True, cwd=ROOT, timeout=900, capture_output=True)
    teach(warm, out)
    shutil.rmtree(warm)


def teach(start: Path, out: Path) -> None:
    import torch

    from rlsched.config import Precision
    from rlsched.model.checkpoint import load_checkpoint, published_state, state_bytes, write_checkpoint
    from rlsched.model.precision import autocast
    from rlsched.rl import agent as ag
    from rlsched.rl.batching import pack, sequence_logprobs
    from rlsched.rl.tool_warmup import episode_tokens, teacher_episode

    ckpt = load_checkpoint(start, dtype=torch.float32)
    tok = ckpt.tokenizer
    tok.hf.chat_template = TEMPLATE.read_text()
    tools = ag.environment_factory(agent_cfg())().tools
    end = tok.id_of("<|im_end|>")
    episodes = [teacher_episode(p) for p in teacher_problems()]
    episodes.append(
        [
            *(m.model_dump() for m in broken_problem().messages()),
            {"role": "assistant", "content": BROKEN_REPLY},
        ]
    )
    rows = [episode_tokens(tok, e, tools, end) for e in episodes]
    batch = pack(
        [r[0] for r in rows], [r[1] for r in rows], tok.pad_token_id or 0, masks=[r[2] for r in rows]
    )
    model = ckpt.model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    for _ in range(STEPS):
        with autocast(Precision.AUTO):  # bf16 where the CPU has BF16 units: 1.8x faster here
            logp = sequence_logprobs(model, batch)
        loss = -(logp * batch.loss_mask).sum() / batch.loss_mask.sum()
        loss.backward()
        opt.step()
        opt.zero_grad()
    fp32 = {k: v.detach() for k, v in published_state(model.eval()).items()}
    write_checkpoint(start, state_bytes(fp32), out)
