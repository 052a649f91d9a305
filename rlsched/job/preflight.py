"""What a job's run checks before any Ray process starts, so that what would fail later is said at
once with its fix: the checkpoint, template and task load, every prompt fits the model's context, a
multi-turn job's combination of modes, the embedded cluster can host the job, the run's directories
can be written, the partial-output store opens, and the engine can serve the checkpoint.
"""

from __future__ import annotations

import os
from pathlib import Path

from rlsched.config import EngineKind, JobConfig
from rlsched.config_params import embedded_resources, store_path
from rlsched.engine.protocol import SamplingParams
from rlsched.errors import UserError
from rlsched.job.capacity import check_capacity
from rlsched.job.durability import checkpoint_root
from rlsched.model.checkpoint import BASE_CHECKPOINT, inspect_checkpoint, load_prompting
from rlsched.model.tokenizer import Tokenizer
from rlsched.rl import agent as ag
from rlsched.rl.task import check_prompts
from rlsched.rl.tasks import build_task
from rlsched.store.partial import PartialStore, StoreError


def preflight(cfg: JobConfig, out_dir: Path, address: str | None = None) -> str | None:
    """Check what can be checked before any Ray process starts: checkpoint, template and task load,
    every prompt fits the model's context, the embedded cluster can host the job, the partial-output
    store can be written, and the chosen engine can serve the checkpoint (vLLM installed, where this
    Python runs the embedded cluster's instances). Returns a note for the user when some generations
    will be cut short by the context."""
    info = inspect_checkpoint(cfg.model.checkpoint)
    tokenizer, template = load_prompting(cfg.model.checkpoint, cfg.model.template)
    if cfg.agent.enabled:
        check_agent(cfg, tokenizer)
    if cfg.engine.kind is EngineKind.VLLM:
        from rlsched.engine.vllm import check_checkpoint, check_vllm_installed

        check_checkpoint(cfg.model.checkpoint or BASE_CHECKPOINT)  # what no install would fix comes first
        if address is None:
            check_vllm_installed()
    task = build_task(cfg.task)
    source = str(cfg.task.path or f"the {cfg.task.name} task")
    room = check_prompts(task, tokenizer, template, info.context_length, cfg.sampling.max_tokens, source)
    check_writable(cfg, out_dir)
    if address is None:  # the embedded cluster's size is the config's: refused before Ray starts
        check_capacity(cfg, embedded_resources(cfg))
    path = store_path(cfg, out_dir)
    if path is not None:
        try:
            PartialStore(path).close()
        except StoreError as err:
            raise UserError(str(err)) from None
    return room.note()


def check_agent(cfg: JobConfig, tokenizer: Tokenizer) -> None:
    """A multi-turn job's (`agent.tools`) template and tools, checked before it starts."""
    spec = ag.spec_of(cfg, SamplingParams())  # its tools' template and programs read now: said here
    if spec.chat_template is not None:
        tokenizer.hf.chat_template = spec.chat_template
    ag.check_renders_tools(tokenizer, ag.environment_factory(cfg.agent)().tools)


def check_writable(cfg: JobConfig, out_dir: Path) -> None:
    """The run's directory, its checkpoints' and the upload location can be written: a job whose
    commits or checkpoints would fail must not start."""
    for where, what in (
        (out_dir, "the run's directory (--out)"),
        (checkpoint_root(cfg, out_dir), "checkpoint.dir"),
        (cfg.checkpoint.upload_to, "checkpoint.upload_to"),
    ):
        if where is None:
            continue
        try:
            where.mkdir(parents=True, exist_ok=True)
            probe = where / f".rlsched-write-test-{os.getpid()}"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as err:
            raise UserError(
                f"{what} {where} cannot be written ({err.strerror or err}); the job commits every "
                "iteration there and would lose its record. Choose a writable directory"
            ) from None
