"""In-flight weight updates: the log-prob drift of a continuation that finishes on the old version,
one swapped to the new version with its keys and values recomputed, and one swapped keeping them.

    .venv/bin/python scripts/bench_inflight.py [--requests 16] [--tokens 32] [--swap-at 12]

Workload, per checkpoint (the shipped base, and SmolLM2-135M where `make model-smollm2` wrote it):
`--requests` prompts of the toy task's held-out problems, each sampled at temperature 1 with a seed of
its own and no stop tokens, so every request decodes `--tokens` tokens. Version 1 is version 0 after
one AdamW step at the job's learning rate (3e-4 for the base, 5e-6 for SmolLM2) on the model's own
samples (the policy-gradient step of a batch whose advantages are all 1): an update of the size a
pipelined job swaps in. Each mode runs the same seeded requests on a fresh engine; in the swap modes
version 1 comes in the moment request 0 has sampled `--swap-at` tokens, so every request crosses it.

For the tokens after the swap point, against full forward passes of the whole sequence:
- behaviour error: |engine log-prob - the exact log-prob under the version that sampled the token|.
  The unswapped run's figure is the engine's numerical floor (decode against a full forward, in the
  engine's dtype); the recomputed swap should sit at that floor, the kept one above it (its drift).
- gap to version 1: |engine log-prob - version 1's log-prob|, what the trainer's importance weights
  correct for: the unswapped continuation is one version stale, a swapped one is not.
Medians over tokens (means beside them). Writes bench_results/bench_inflight.json (or --json).
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from _bench import parser, table, write

from rlsched.engine.intake import Intake
from rlsched.engine.protocol import (
    GenerationRequest,
    RequestId,
    Sample,
    SamplingParams,
    TokenEvent,
    WeightVersion,
)
from rlsched.engine.torch_engine import TorchRolloutEngine, engine_dtype
from rlsched.model.checkpoint import Checkpoint, load_checkpoint, load_state_bytes, to_bf16_bytes
from rlsched.policy.versions import SwapKV
from rlsched.rl.task import AdditionTask

SMOLLM2 = Path("models/smollm2-135m-instruct")
MODES = ("unswapped (finish on v0)", "swap, recompute", "swap, keep")


def _prompts(ck: Checkpoint, n: int) -> list[tuple[int, ...]]:
    problems = AdditionTask().eval_problems[:n]
    return [tuple(ck.template.encode(ck.tokenizer, p.messages())) for p in problems]


def _requests(prompts: list[tuple[int, ...]], tokens: int, seed: int) -> list[GenerationRequest]:
    return [
        GenerationRequest(
            RequestId(str(i)), p, SamplingParams(temperature=1.0, max_tokens=tokens, seed=seed + i)
        )
        for i, p in enumerate(prompts)
    ]


def _updated(model: torch.nn.Module, samples: Sequence[Sample], lr: float) -> bytes:
    """Version 1: one AdamW step (fp32 masters) raising the log-likelihood of the model's own samples."""
    trained = copy.deepcopy(model).float().train()
    opt = torch.optim.AdamW(trained.parameters(), lr=lr, weight_decay=0.0)
    loss = torch.zeros(())
    for s in samples:
        ids = torch.tensor([[*s.prompt_ids, *s.token_ids]])
        logp = trained(ids).logits[0, len(s.prompt_ids) - 1 : -1].log_softmax(-1)
        loss = loss - logp.gather(1, torch.tensor(s.token_ids)[:, None]).mean() / len(samples)
    loss.backward()
    opt.step()
    return to_bf16_bytes(trained)


def _run(ck_dir: Path | None, dtype: torch.dtype, reqs: list[GenerationRequest], mode: str,
         new: bytes | None, swap_at: int) -> tuple[list[Sample], float, int]:  # fmt: skip
    ck = load_checkpoint(ck_dir, dtype=dtype)
    kv = SwapKV.KEEP if mode.endswith("keep") else SwapKV.RECOMPUTE
    engine = TorchRolloutEngine(ck.model, ck.tokenizer, max_batch=len(reqs), swap_kv=kv)
    seen = {"n": 0}

    def on_tokens(events: Sequence[TokenEvent]) -> None:
        seen["n"] += sum(e.request_id == "0" for e in events)
        if new is not None and seen["n"] == swap_at:
            engine.load_weights(new, WeightVersion(1))

    intake = Intake(reqs)
    intake.close()
    t0 = time.perf_counter()
    samples = sorted(engine.serve(intake, on_tokens), key=lambda s: int(s.request_id))
    return samples, time.perf_counter() - t0, engine.recomputed_tokens


def _full_logprobs(model: torch.nn.Module, s: Sample) -> list[float]:
    with torch.no_grad():
        logp = model(torch.tensor([[*s.prompt_ids, *s.token_ids]])).logits.float().log_softmax(-1)[0]
    n = len(s.prompt_ids)
    return [float(logp[n - 1 + i, t]) for i, t in enumerate(s.token_ids)]


def _gaps(samples: list[Sample], models: dict[int, torch.nn.Module], swap_at: int) -> dict[str, list[float]]:
    behaviour, to_new = [], []
    for s in samples:
        exact = {v: _full_logprobs(m, s) for v, m in models.items()}
        for v, start, end in s.token_versions():
            for i in range(max(start, swap_at), end):
                behaviour.append(abs(s.logprobs[i] - exact[v][i]))
                to_new.append(abs(s.logprobs[i] - exact[1][i]))
    return {"behaviour": behaviour, "to_v1": to_new}


def measure(name: str, ck_dir: Path | None, lr: float, args: argparse.Namespace) -> list[dict[str, Any]]:
    dtype = engine_dtype(args.dtype)
    ck = load_checkpoint(ck_dir, dtype=dtype)
    reqs = _requests(_prompts(ck, args.requests), args.tokens, args.seed)
    first, _, _ = _run(ck_dir, dtype, reqs, MODES[0], None, args.swap_at)
    new = _updated(ck.model, first, lr)
    newer = copy.deepcopy(ck.model)
    load_state_bytes(newer, new)
    models = {0: ck.model.eval(), 1: newer.eval()}
    rows = []
    for mode in MODES:
        samples, seconds, recomputed = (
            (first, 0.0, 0) if mode == MODES[0] else _run(ck_dir, dtype, reqs, mode, new, args.swap_at)
        )
        swapped = sum(len(s.version_spans) > 1 for s in samples)
        gaps = _gaps(samples, models, args.swap_at)
        rows.append(
            {"checkpoint": name, "mode": mode, "dtype": str(dtype).removeprefix("torch."), "lr": lr,
             "samples_swapped": swapped, "samples": len(samples), "recomputed_tokens": recomputed,
             "generate_s": seconds,
             "behaviour_error_median": statistics.median(gaps["behaviour"]),
             "behaviour_error_mean": statistics.fmean(gaps["behaviour"]),
             "gap_to_v1_median": statistics.median(gaps["to_v1"]),
             "gap_to_v1_mean": statistics.fmean(gaps["to_v1"])}
        )  # fmt: skip
        print(f"{name}: {mode} done")
    return rows


def main() -> None:
    ap = parser(__doc__, "bench_inflight")
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--dtype", default="auto", help="engine dtype: auto (as engine.dtype), float32, bfloat16")
    ap.add_argument("--swap-at", type=int, default=12, help="request 0's tokens before version 1 comes in")
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    torch.set_num_threads(2)
    rows = measure("base", None, 3e-4, args)
    if SMOLLM2.is_dir():
        rows += measure("smollm2-135m", SMOLLM2, 5e-6, args)
    else:
        print(f"SmolLM2 skipped: {SMOLLM2} is missing (make model-smollm2)")
    table(
        f"in-flight swap: log-prob drift after the swap ({args.requests} requests x {args.tokens} tokens, "
        f"swap at token {args.swap_at})",
        [
            "checkpoint",
            "mode",
            "swapped",
            "behaviour err p50",
            "(mean)",
            "gap to v1 p50",
            "(mean)",
            "recomputed",
        ],
        [
            [
                r["checkpoint"],
                r["mode"],
                f"{r['samples_swapped']}/{r['samples']}",
                f"{r['behaviour_error_median']:.2e}",
                f"{r['behaviour_error_mean']:.2e}",
                f"{r['gap_to_v1_median']:.2e}",
                f"{r['gap_to_v1_mean']:.2e}",
                r["recomputed_tokens"],
            ]
            for r in rows
        ],
        width=160,
    )
    write(
        args.json,
        {
            "workload": f"{args.requests} toy-task prompts x {args.tokens} tokens at temperature 1, no stop; "
            f"version 1 swapped in at request 0's token {args.swap_at}; see the docstring",
            "seed": args.seed,
            "bound": "behaviour error of the unswapped run (the engine's numerical floor)",
            "rows": rows,
        },
    )


if __name__ == "__main__":
    main()
