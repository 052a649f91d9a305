"""Does reward teach what more supervised steps would not? GRPO against SFT, same base, same wall time.

    .venv/bin/python scripts/bench_rl_vs_sft.py [--seconds 60] [--seed 0]

Workload: the shipped base model and the toy addition task (rlsched/rl/task.py). Three arms, each
from the same base for the same wall-clock budget, judged on the same 1,024 held-out problems with
greedy decoding:
- `grpo`: the quickstart GRPO loop (reward from the exact-answer verifier, no labels);
- `sft_teacher`: more supervised steps on the data the base was trained on (the noisy teacher);
- `sft_clean`: supervised steps on correct answers, the bound: what labels, had we had them, give.
Writes bench_results/bench_rl_vs_sft.json.
"""

from __future__ import annotations

import random
import time
from pathlib import Path

import torch
from _bench import parser, write
from rich.console import Console
from rich.table import Table

from rlsched.config import load_config
from rlsched.engine.torch_engine import TorchRolloutEngine
from rlsched.model.checkpoint import load_checkpoint
from rlsched.rl.evaluate import EvalResult, evaluate
from rlsched.rl.loop import GRPOLoop
from rlsched.rl.sft import sft_step
from rlsched.rl.task import AdditionTask, teacher_answer

CARRY_DROP = 0.6  # the teacher of scripts/pretrain_base.py


def run_grpo(seconds: float, seed: int) -> tuple[EvalResult, int]:
    cfg = load_config(
        Path("configs/jobs/quickstart.yaml"),
        [f"grpo.time_budget_s={seconds}", "grpo.steps=100000", "eval.every_steps=100000", f"run.seed={seed}"],
    )
    loop = GRPOLoop(cfg, log=lambda _: None)
    report = loop.run()
    return report.after, len(report.steps)


def run_sft(
    seconds: float, seed: int, clean: bool, lr: float = 3e-4, batch: int = 128
) -> tuple[EvalResult, int]:
    ckpt = load_checkpoint()
    task = AdditionTask()
    rng = random.Random(seed)
    stream = task.train_problems(rng)
    opt = torch.optim.AdamW(ckpt.model.parameters(), lr=lr, weight_decay=0.0)
    steps = 0
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        problems = [next(stream) for _ in range(batch)]
        answers = [p.answer if clean else teacher_answer(p, rng, CARRY_DROP) for p in problems]
        sft_step(ckpt.model, opt, ckpt.tokenizer, ckpt.template, problems, answers)
        steps += 1
    ckpt.model.eval()
    engine = TorchRolloutEngine(ckpt.model, ckpt.tokenizer, max_batch=256)
    return evaluate(engine, ckpt.tokenizer, ckpt.template, task.eval_problems), steps


def main() -> None:
    ap = parser(__doc__, "bench_rl_vs_sft")
    ap.add_argument("--seconds", type=float, default=60.0)
    args = ap.parse_args()
    torch.set_num_threads(2)
    ckpt = load_checkpoint()
    base = evaluate(
        TorchRolloutEngine(ckpt.model, ckpt.tokenizer, max_batch=256),
        ckpt.tokenizer,
        ckpt.template,
        AdditionTask().eval_problems,
    )
    arms: dict[str, tuple[EvalResult, int]] = {"base": (base, 0)}
    for name, fn in (
        ("grpo", lambda: run_grpo(args.seconds, args.seed)),
        ("sft_teacher", lambda: run_sft(args.seconds, args.seed, clean=False)),
        ("sft_clean", lambda: run_sft(args.seconds, args.seed, clean=True)),
    ):
        torch.manual_seed(args.seed)
        arms[name] = fn()
        print(f"{name}: {arms[name][0]} after {arms[name][1]} steps", flush=True)

    table = Table(
        title=f"held-out greedy pass rate after {args.seconds:.0f} s from the shipped base (seed {args.seed})"
    )
    for col in ("arm", "steps", "pass rate", "carry problems", "vs base (points)"):
        table.add_column(col, justify="right")
    for name, (res, steps) in arms.items():
        table.add_row(
            name,
            str(steps),
            f"{100 * res.pass_rate:.1f}%",
            f"{100 * res.carry_pass_rate:.1f}%",
            f"{100 * (res.pass_rate - base.pass_rate):+.1f}",
        )
    Console().print(table)
    write(
        args.json,
        {
            "benchmark": "bench_rl_vs_sft",
            "workload": {
                "task": "3-digit addition, reversed answers",
                "eval_problems": base.total,
                "budget_s_per_arm": args.seconds,
                "teacher_carry_drop": CARRY_DROP,
            },
            "seed": args.seed,
            "bound": "sft_clean: supervised steps on correct labels for the same wall time",
            "results": {
                name: {
                    "steps": steps,
                    "pass_rate": res.pass_rate,
                    "carry_pass_rate": res.carry_pass_rate,
                    "gain_points": round(100 * (res.pass_rate - base.pass_rate), 2),
                }
                for name, (res, steps) in arms.items()
            },
        },
    )


if __name__ == "__main__":
    main()
