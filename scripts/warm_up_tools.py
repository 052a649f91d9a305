"""Warm SmolLM2-135M-Instruct up on calculator episodes and write it as a checkpoint: the start of the
multi-turn job `configs/jobs/agent_calc.yaml` (`make model-smollm2-calc`).

    .venv/bin/python scripts/warm_up_tools.py [--steps 14] [--eval 64] [--out models/smollm2-calc]

Teacher episodes on the job's training problems (`rlsched.rl.tool_warmup`), a few AdamW steps, then
the held-out success rate of greedy episodes with the real sandboxed calculator, before and after,
and the checkpoint (the tools template as its chat template) in `--out`.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rlsched.config import load_config  # noqa: E402
from rlsched.model.checkpoint import to_bf16_bytes, write_checkpoint  # noqa: E402
from rlsched.rl.loop import GRPOLoop  # noqa: E402
from rlsched.rl.tool_warmup import warm_up  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default=str(ROOT / "configs/jobs/agent_calc.yaml"))
    ap.add_argument("--checkpoint", default=str(ROOT / "models/smollm2-135m-instruct"))
    ap.add_argument("--steps", type=int, default=14)
    ap.add_argument("--lr", type=float, default=2e-5)
    ap.add_argument(
        "--eval", type=int, default=64, help="held-out problems evaluated before and after (0: none)"
    )
    ap.add_argument("--out", default=str(ROOT / "models/smollm2-calc"))
    args = ap.parse_args()
    torch.set_num_threads(2)
    cfg = load_config(Path(args.config), [f"model.checkpoint={args.checkpoint}", "engine.dtype=float32"])
    loop = GRPOLoop(cfg)
    assert loop.agent is not None
    tok, tools = loop.ckpt.tokenizer, loop.agent.make_env().tools
    end = tok.id_of("<|im_end|>")
    assert end is not None
    t = time.monotonic()
    before = loop.evaluate(args.eval) if args.eval else None
    if before is not None:
        print(f"before: {before} of held-out episodes right, {loop.last_eval_episodes}")
    losses = warm_up(
        loop.policy,
        tok,
        loop.task.train,
        tools,
        end,
        steps=args.steps,
        lr=args.lr,
        seed=cfg.run.seed,
        precision=cfg.trainer.precision,  # the job's own setting: auto unless the config forces one
    )
    loop.publish(1)
    after = loop.evaluate(args.eval) if args.eval else None
    if after is not None:
        print(f"after {args.steps} steps: {after}, {loop.last_eval_episodes}")
    print(f"warm-up done in {time.monotonic() - t:.0f} s")
    out = Path(args.out)
    write_checkpoint(loop.ckpt.path, to_bf16_bytes(loop.policy), out)
    assert cfg.agent.chat_template is not None
    shutil.copy2(cfg.agent.chat_template, out / "chat_template.jinja")
    (out / "warm_up.json").write_text(
        json.dumps(
            {
                "steps": args.steps,
                "lr": args.lr,
                "losses": losses,
                "before": str(before),
                "after": str(after),
            },
            indent=1,
        )
    )
    loop.agent.close()
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
