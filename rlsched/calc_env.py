"""`rlsched calc env MODEL`: the environment models of the seed chapter (SPEC section 9) on the command
line, each a thin wrapper over `rlsched.policy.environments` (the same functions the simulator uses).

    rlsched calc env load --rounds 3 --model-s 9 --tool-s 1 --env-gib 2 --rate 10 \\
        --cores 48 --slots 320 --memory-gib 358 --template-gib 2
    rlsched calc env release --rounds 3 --model-s 9 --tool-s 1 --env-gib 2 --prepare-s 2 --rate 10 \\
        --prepare-cpu-s 0.1 [--just-in-time]
    rlsched calc env pause --env-gib 2 --gap-s 9 --save-s-per-gib 4 --resume-s 1
    rlsched calc env prewarm --prepare-s 2 --hit-rate 0.75 --lead-s 1,2,3 --env-gib 2
    rlsched calc env template --environments 100 --template-mib 2048 --accessed-mib 512 \\
        --dirtied-mib 128 --overhead-mib 4 --hot-mib 256 --link-gbit 25 --install-gib 0.5
    rlsched calc env cost --total 1 --attempts 10 --successes 5 --success-cost 0.5
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from rlsched.policy import environments as env


def _load(a: argparse.Namespace) -> dict[str, Any]:
    capacity = env.Capacity(a.cores, a.slots, a.memory_gib, a.template_gib)
    load = env.task_load(a.rounds, a.model_s, a.tool_s, a.env_gib, a.rate, capacity, a.tool_cores)
    return asdict(load) | {
        "formula": "task = R (model + tool); in flight = rate R model; cores = rate R tool; "
        "environments = rate task (Little's law); memory = environments M; binding = the highest "
        "demand / capacity; max environments = (memory - template) / M"
    }


def _release(a: argparse.Namespace) -> dict[str, Any]:
    plan = env.release_plan(
        a.rounds, a.model_s, a.tool_s, a.env_gib, a.prepare_s, a.rate, a.just_in_time, a.prepare_cpu_s
    )
    return asdict(plan) | {
        "formula": "task = R (model + wait + tool), wait = 0 just in time else P; held R (P + tool) "
        "a task; memory = rate x that x M; creations = rate R; cores = rate R (tool + prepare CPU)"
    }


def _pause(a: argparse.Namespace) -> dict[str, Any]:
    plan = env.pause_plan(a.env_gib, a.gap_s, a.save_s_per_gib, a.resume_s, a.price, a.transition_cost)
    return asdict(plan) | {
        "formula": "save = M x save per GiB; freed = max(0, G - save - resume); pays when "
        "price x M x freed > transition cost"
    }


def _prewarm(a: argparse.Namespace) -> dict[str, Any]:
    leads = [float(x) for x in a.lead_s.split(",")]
    rows = [env.prewarm_wait(a.prepare_s, a.hit_rate, lead, a.env_gib) for lead in leads]
    return {
        "lead_s": leads,
        "expected_wait_s": [r.expected_wait_s for r in rows],
        "early_gib_s": [r.early_gib_s for r in rows],
        "formula": "E[W] = P - h min(P, L); a right prediction holds a ready environment max(0, L - P) "
        "early: h M max(0, L - P) GiB-s",
    }


def _template(a: argparse.Namespace) -> dict[str, Any]:
    memory = env.template_memory(
        a.environments, a.template_mib, a.accessed_mib, a.dirtied_mib, a.overhead_mib, a.hot_mib
    )
    out = asdict(memory)
    if a.link_gbit is not None:
        fetch = a.template_mib / 1024
        out["install_s"] = env.install_s(fetch, a.install_gib, a.link_gbit)
        out["install_cached_s"] = env.install_s(fetch, a.install_gib, a.link_gbit, cached=True)
    return out | {
        "formula": "per environment: full copy = template + overhead; on demand = accessed + overhead; "
        "shared = dirtied + overhead; shared with hot pages = dirtied + hot + overhead; install at "
        "least (template + install) / link, install / link when cached"
    }


def _cost(a: argparse.Namespace) -> dict[str, Any]:
    return asdict(env.cost_per_success(a.total, a.attempts, a.successes, a.success_cost)) | {
        "formula": "every attempt's cost / successes (the successes' own cost / successes undercounts)"
    }


MODELS: dict[str, Callable[[argparse.Namespace], dict[str, Any]]] = {
    "load": _load,
    "release": _release,
    "pause": _pause,
    "prewarm": _prewarm,
    "template": _template,
    "cost": _cost,
}


def calc_env(args: argparse.Namespace) -> dict[str, Any]:
    return MODELS[args.env_model](args)


def _task(p: argparse.ArgumentParser) -> None:
    p.add_argument("--rounds", type=int, required=True, metavar="R", help="model-then-tool rounds a task")
    p.add_argument("--model-s", type=float, required=True, metavar="S", help="seconds a model call")
    p.add_argument("--tool-s", type=float, required=True, metavar="S", help="seconds a tool call")
    p.add_argument("--env-gib", type=float, required=True, metavar="M", help="an environment's memory")
    p.add_argument("--rate", type=float, required=True, metavar="TASKS_PER_S", help="tasks started a second")


def add_parser(sub: Any) -> list[argparse.ArgumentParser]:
    """`calc env` and its models; the parsers that take `--json`."""
    e = sub.add_parser("env", help="agent environments: load, release, pause, prewarm, template, cost")
    models = e.add_subparsers(dest="env_model", required=True, metavar="MODEL")
    load = models.add_parser("load", help="Little's law: environments, memory, CPU and slots; what binds")
    _task(load)
    load.add_argument("--cores", type=float, required=True, help="CPU cores")
    load.add_argument("--slots", type=float, required=True, help="model calls the fleet runs at once")
    load.add_argument("--memory-gib", type=float, required=True, help="memory for environments")
    load.add_argument("--template-gib", type=float, default=0.0, help="memory a kept template takes")
    load.add_argument("--tool-cores", type=float, default=1.0, help="cores a tool call keeps busy")
    release = models.add_parser("release", help="released after each tool call: on demand or just in time")
    _task(release)
    release.add_argument("--prepare-s", type=float, required=True, metavar="P", help="seconds to prepare")
    release.add_argument("--prepare-cpu-s", type=float, default=0.0, help="CPU-seconds a preparation costs")
    release.add_argument("--just-in-time", action="store_true", help="prepared P before the call ends")
    pause = models.add_parser("pause", help="pausing an environment over an idle gap: what it frees")
    pause.add_argument("--env-gib", type=float, required=True, metavar="M")
    pause.add_argument("--gap-s", type=float, required=True, metavar="G", help="the idle gap (a model call)")
    pause.add_argument("--save-s-per-gib", type=float, required=True, help="seconds to save a GiB")
    pause.add_argument("--resume-s", type=float, required=True, help="seconds to resume")
    pause.add_argument("--price", type=float, help="price of a GiB-second (with --transition-cost)")
    pause.add_argument("--transition-cost", type=float, help="what a save and restore cost, in that money")
    pre = models.add_parser("prewarm", help="pre-warming with a tool-type prediction: expected wait")
    pre.add_argument("--prepare-s", type=float, required=True, metavar="P")
    pre.add_argument("--hit-rate", type=float, required=True, metavar="H", help="the prediction's hit rate")
    pre.add_argument("--lead-s", required=True, metavar="L1,L2,...", help="leads to compare")
    pre.add_argument("--env-gib", type=float, default=0.0, metavar="M")
    tpl = models.add_parser("template", help="N environments from one template: memory by sharing")
    tpl.add_argument("--environments", type=int, required=True, metavar="N")
    tpl.add_argument("--template-mib", type=float, required=True)
    tpl.add_argument("--accessed-mib", type=float, required=True, help="pages a tool reads")
    tpl.add_argument("--dirtied-mib", type=float, required=True, help="pages a tool writes")
    tpl.add_argument("--overhead-mib", type=float, default=0.0, help="bookkeeping per environment")
    tpl.add_argument("--hot-mib", type=float, default=0.0, help="hot pages kept per environment")
    tpl.add_argument("--link-gbit", type=float, help="the link the template is fetched over")
    tpl.add_argument("--install-gib", type=float, default=0.0, help="what installing it writes")
    cost = models.add_parser("cost", help="cost per successful task, failed attempts counted")
    cost.add_argument("--total", type=float, required=True, help="what every attempt cost")
    cost.add_argument("--attempts", type=int, required=True)
    cost.add_argument("--successes", type=int, required=True)
    cost.add_argument("--success-cost", type=float, required=True, help="what the successes alone cost")
    return [load, release, pause, pre, tpl, cost]
