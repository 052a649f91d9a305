"""transformers' LlamaForCausalLM loads an exported directory and agrees with rlsched token for token."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rlsched.engine.protocol import GenerationRequest, RequestId, SamplingParams
from rlsched.engine.torch_engine import TorchRolloutEngine
from rlsched.model.checkpoint import export_checkpoint, load_checkpoint
from rlsched.model.template import Message

transformers = pytest.importorskip("transformers")

PROMPTS = ["123+456", "905+387", "hello there", "999+999"]


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return export_checkpoint(tmp_path_factory.mktemp("hf") / "base")


def _greedy_rlsched(ckpt_dir: Path, prompt_ids: list[int], n: int) -> tuple[int, ...]:
    ckpt = load_checkpoint(ckpt_dir)
    engine = TorchRolloutEngine(ckpt.model, ckpt.tokenizer)
    params = SamplingParams(temperature=0.0, max_tokens=n)
    (s,) = engine.generate([GenerationRequest(RequestId("x"), tuple(prompt_ids), params)])
    return s.token_ids


def test_tokenizer_and_chat_template_agree(exported: Path) -> None:
    hf_tok = transformers.AutoTokenizer.from_pretrained(exported)
    ckpt = load_checkpoint(exported)
    for p in PROMPTS:
        msgs = [Message(role="user", content=p)]
        ours = ckpt.template.encode(ckpt.tokenizer, msgs)
        theirs = hf_tok.apply_chat_template(
            [m.model_dump() for m in msgs], add_generation_prompt=True, tokenize=True, return_dict=False
        )
        assert list(theirs) == ours
        assert hf_tok.encode(p, add_special_tokens=False) == ckpt.tokenizer.encode(p)


def test_greedy_continuation_matches_token_for_token(exported: Path) -> None:
    model = transformers.LlamaForCausalLM.from_pretrained(exported, dtype=torch.float32).eval()
    ckpt = load_checkpoint(exported)
    for p in PROMPTS:
        ids = ckpt.template.encode(ckpt.tokenizer, [Message(role="user", content=p)])
        n = 10
        with torch.no_grad():
            out = model.generate(
                torch.tensor([ids]),
                max_new_tokens=n,
                do_sample=False,
                eos_token_id=None,
                min_new_tokens=n,
                pad_token_id=3,
            )
        theirs = tuple(out[0, len(ids) :].tolist())
        assert _greedy_rlsched(exported, ids, n) == theirs


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-4), (torch.bfloat16, 0.15)])
def test_logits_agree_within_tolerance(exported: Path, dtype: torch.dtype, tol: float) -> None:
    model = transformers.LlamaForCausalLM.from_pretrained(exported, dtype=dtype).eval()
    ckpt = load_checkpoint(exported)
    ids = torch.tensor([ckpt.template.encode(ckpt.tokenizer, [Message(role="user", content="321+654")])])
    with torch.no_grad():
        theirs = model(ids).logits.float()
        ours = ckpt.model(ids)
    assert (theirs - ours).abs().max().item() < tol
    assert torch.equal(theirs.argmax(-1), ours.argmax(-1)) or dtype is torch.bfloat16
