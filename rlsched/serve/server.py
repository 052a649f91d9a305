"""Starting the endpoint: a checkpoint's engine and template behind the app, served by uvicorn.

`local_served` loads a checkpoint into a torch engine in this process (`rlsched serve`, the tests,
`scripts/bench_endpoint.py`). `Running` starts uvicorn on a thread of its own and reports the
address it bound (port 0 picks a free one), so a caller (a test, a job's driver) goes on while it
serves; `stop` shuts it down and closes the engine's loop.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path

import uvicorn

from rlsched.config import EndpointConfig, EngineKind
from rlsched.engine.prefix_cache import BLOCK
from rlsched.engine.torch_engine import TorchRolloutEngine, engine_dtype
from rlsched.errors import UserError
from rlsched.model.checkpoint import BASE_CHECKPOINT, Checkpoint, load_checkpoint, load_prompting
from rlsched.model.template import ChatTemplate, PromptFormat
from rlsched.model.tokenizer import Tokenizer
from rlsched.serve.app import build_app
from rlsched.serve.backend import LocalEngine, VllmEngine
from rlsched.serve.run import Served

START_TIMEOUT_S = 60.0
PREFIX_CACHE_TOKENS = 8192  # SmolLM2-135M in BF16: 23 KB a token, 190 MB in all


def local_served(
    checkpoint: Path | None,
    *,
    template: str | None = None,
    chat_template: Path | None = None,
    model_name: str | None = None,
    max_batch: int = 64,
    dtype: str = "auto",
    seed: int = 0,
    prefix_cache_tokens: int = PREFIX_CACHE_TOKENS,
    engine: EngineKind = EngineKind.TORCH,
) -> Served:
    """A checkpoint's engine (torch, or vLLM: `vllm_served`) in this process. `chat_template`: a
    Jinja file to use instead of the checkpoint's own (vLLM's `--chat-template`), e.g. one that renders tools;
    `prefix_cache_tokens`: how many tokens' keys and values the engine keeps for requests that
    share a prefix (a system prompt, the turns before this one); 0: none."""
    if engine is EngineKind.VLLM:
        return vllm_served(
            checkpoint, template=template, chat_template=chat_template, model_name=model_name,
            max_batch=max_batch, seed=seed,
        )  # fmt: skip
    ckpt = load_checkpoint(checkpoint, template=template, dtype=engine_dtype(dtype))
    return served_from(
        ckpt, chat_template=chat_template, model_name=model_name, max_batch=max_batch, seed=seed,
        prefix_cache_tokens=prefix_cache_tokens,
    )  # fmt: skip


def served_from(
    ckpt: Checkpoint,
    *,
    chat_template: Path | None = None,
    model_name: str | None = None,
    max_batch: int = 64,
    seed: int = 0,
    prefix_cache_tokens: int = PREFIX_CACHE_TOKENS,
) -> Served:
    """`local_served` for a checkpoint already loaded (a test's fine-tuned model)."""
    prompts = with_chat_template(ckpt.tokenizer, ckpt.template, chat_template)
    engine = TorchRolloutEngine(
        ckpt.model, ckpt.tokenizer, max_batch=max_batch, seed=seed,
        prefix_cache_blocks=-(-prefix_cache_tokens // BLOCK),
    )  # fmt: skip
    return Served(LocalEngine(engine), ckpt.tokenizer, prompts, model_name or ckpt.path.name)


def with_chat_template(tokenizer: Tokenizer, prompts: PromptFormat, path: Path | None) -> PromptFormat:
    """The prompt format with the Jinja template at `path` instead of the checkpoint's (if given)."""
    if path is None:
        return prompts
    try:
        tokenizer.hf.chat_template = path.read_text()
    except OSError as err:
        raise UserError(f"cannot read the chat template {path}: {err.strerror}") from None
    return ChatTemplate(tokenizer, prompts.stop_token_ids, name=path.stem)


def vllm_served(
    checkpoint: Path | None,
    *,
    template: str | None = None,
    chat_template: Path | None = None,
    model_name: str | None = None,
    max_batch: int = 64,
    seed: int = 0,
) -> Served:
    """A checkpoint's vLLM engine (its own prefix cache reports `cached_tokens`)."""
    from rlsched.engine.vllm import VllmRolloutEngine  # vLLM is optional: imported only when chosen

    path = checkpoint or BASE_CHECKPOINT
    tokenizer, prompts = load_prompting(path, template)
    prompts = with_chat_template(tokenizer, prompts, chat_template)
    engine = VllmRolloutEngine(path, max_batch=max_batch, seed=seed)
    return Served(VllmEngine(engine), tokenizer, prompts, model_name or path.name)


@dataclass
class Running:
    server: uvicorn.Server
    thread: threading.Thread
    served: Served
    host: str
    port: int

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    def stop(self, close_backend: bool = True) -> None:
        """Stop serving; `close_backend=False` leaves the engine to another app over it."""
        self.server.should_exit = True
        self.thread.join(timeout=30)
        if close_backend:
            self.served.backend.close()


def start(served: Served, cfg: EndpointConfig) -> Running:
    """Serve on a background thread; returns once it accepts connections."""
    config = uvicorn.Config(
        build_app(served, cfg), host=cfg.host, port=cfg.port, log_level="warning", timeout_graceful_shutdown=5
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="endpoint", daemon=True)
    thread.start()
    deadline = time.monotonic() + START_TIMEOUT_S
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError(f"the endpoint did not start on {cfg.host}:{cfg.port} (is the port taken?)")
        time.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]
    return Running(server, thread, served, cfg.host, int(port))
