"""A tiny model that calls the calculator, as the multi-turn tests need it: built once per checkout by
the `tool_model` fixture (tests/conftest.py) and shared by `tests/component/test_agent_episodes.py`
and `tests/e2e/test_agent_ray.py`.

The tests' point is the mechanism (rounds, tools, sandboxes, journals, resumption), not a recipe's
quality, so the model is small: a 2-layer Llama with SmolLM2-135M-Instruct's tokenizer and tools chat
template (random weights, seeded), so that every token, special token and rendered turn is the one
the real model sees. It is made in two parts. First the user's recipe, `scripts/warm_up_tools.py`
(what `make model-smollm2-calc` runs on SmolLM2), for one step: the script runs end to end and
writes a checkpoint the job loads. Then AdamW steps on four fixed teacher episodes until it has
learned them by heart (`learn_by_heart` checks it): three calculator episodes
(`rlsched.rl.tool_warmup`) and one whose reply is a call that does not parse, so that episodes call
the real calculator on those three problems and make the broken call when asked to. On a problem it
has never seen it writes no call, so the tests use these. The weights are kept in FP32, as trained,
so the episode tests decode what the trained model decodes. Built from SmolLM2 the same way, the
model took 177 s of CI (it now takes about 25 s); SmolLM2 after the 14-step warm-up, and its held-out
results: docs/environments.md.
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
BROKEN_PROMPT = "Call the calculator the wrong way, please."
BROKEN_REPLY = '<tool_call>\n{"name": "calculator", "arguments": \n</tool_call>'
LR, MAX_STEPS = 5e-3, 400
# learned by heart: every reply token of the teacher's at a probability over 0.9 (a loss under 0.1
# nats), so that its greedy choice is the teacher's token with room to spare for the engine's other
# arithmetic (a KV cache, other kernels); about 200 steps and 15 s on one core
BY_HEART = 0.1
SHAPE = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2,
         "num_key_value_heads": 1, "head_dim": 32}  # fmt: skip

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
    """The agent section with the calculator as `configs/jobs/agent_calc.yaml` describes it (the
    system prompt the model learned is the job's), running `program`."""
    import yaml

    from rlsched.config_agent import AgentConfig

    (declared,) = yaml.safe_load((ROOT / "configs" / "jobs" / "agent_calc.yaml").read_text())["agent"][
        "tools"
    ]
    tool = {k: declared[k] for k in ("name", "description", "parameters")}
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


def tiny(smollm2: Path, out: Path) -> None:
    """A 2-layer Llama (`SHAPE`, random weights, seed 0) with SmolLM2's tokenizer, chat template and
    generation config, into `out`: SmolLM2's config with the sizes replaced."""
    import json
    import shutil

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = json.loads((smollm2 / "config.json").read_text()) | SHAPE
    for key in ("_model_name_or_path", "dtype", "transformers_version"):
        config.pop(key, None)
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**config))
    out.mkdir(parents=True)
    model.save_pretrained(out, safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json", "chat_template.jinja"):
        if (smollm2 / name).is_file():
            shutil.copy2(smollm2 / name, out / name)


def build(smollm2: Path, out: Path) -> None:
    """The model, into `out` (see the module docstring)."""
    import shutil

    start, warm = out.with_name(out.name + "-tiny"), out.with_name(out.name + "-warm")
    for d in (start, warm):
        shutil.rmtree(d, ignore_errors=True)
    tiny(smollm2, start)
    command = [sys.executable, "scripts/warm_up_tools.py", "--checkpoint", str(start), "--steps", "1",
               "--eval", "0", "--out", str(warm)]  # fmt: skip
    subprocess.run(command, check=True, cwd=ROOT, timeout=900, capture_output=True)
    teach(warm, out)
    for d in (start, warm):
        shutil.rmtree(d)


def teach(start: Path, out: Path) -> None:
    import torch

    from rlsched.model.checkpoint import load_checkpoint, published_state, state_bytes, write_checkpoint
    from rlsched.rl import agent as ag
    from rlsched.rl.batching import pack
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
    learn_by_heart(model, batch.input_ids, batch.attention_mask, batch.loss_mask > 0, batch.targets)
    fp32 = {k: v.detach() for k, v in published_state(model.eval()).items()}
    write_checkpoint(start, state_bytes(fp32), out)


def learn_by_heart(model: Any, ids: Any, attention: Any, where: Any, targets: Any) -> int:
    """AdamW steps (fp32 on every CPU) until the model gives each of `targets[where]`, after
    the tokens before it in `ids`, a probability over 0.9 (`BY_HEART`); the steps taken. Only those
    positions go through the vocabulary's projection, where most of a step's time goes."""
    import torch

    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    wanted = targets[where]
    model.train()
    for step in range(MAX_STEPS):
        hidden = model.model(input_ids=ids, attention_mask=attention).last_hidden_state
        losses = torch.nn.functional.cross_entropy(model.lm_head(hidden[where]), wanted, reduction="none")
        worst = float(losses.detach().max())
        if worst < BY_HEART:
            model.eval()
            return step
        losses.mean().backward()
        opt.step()
        opt.zero_grad()
    raise AssertionError(
        f"the tiny model did not learn its replies by heart in {MAX_STEPS} steps (worst "
        f"token: {worst:.3f} nats, want < {BY_HEART}); raise MAX_STEPS or LR in tests/agent_model.py"
    )
