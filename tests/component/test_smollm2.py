"""SmolLM2-135M-Instruct, the real pretrained model imported from PyPI (`make model-smollm2`): it
loads through the one model path, its MLC template agrees with its own chat template token for
token, and the torch engine answers as transformers does. Slow: the import takes about 20 s and the
model 270 MB, once a session (`smollm2_dir` in tests/conftest.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rlsched.engine.protocol import GenerationRequest, RequestId, SamplingParams
from rlsched.engine.torch_engine import TorchRolloutEngine
from rlsched.model.checkpoint import load_checkpoint
from rlsched.model.template import Message, load_template, resolve_prompt_format

pytestmark = pytest.mark.slow

CONVERSATIONS = [
    [Message(role="user", content="What is 17+25? Answer with the number only.")],
    [Message(role="system", content="Be terse."), Message(role="user", content="2+2?")],
    [
        Message(role="user", content="hi"),
        Message(role="assistant", content="Hello! How can I help?"),
        Message(role="user", content="Größe 東京 🙂"),
    ],
]


def test_it_loads_as_the_import_described_it(smollm2_dir: Path) -> None:
    ck = load_checkpoint(smollm2_dir)
    info = ck.info
    assert (info.architecture, info.tied, info.head_dim, info.vocab_size) == (
        "LlamaForCausalLM",
        True,
        64,
        49152,
    )
    assert sum(p.numel() for p in ck.model.parameters()) == 134_515_008
    assert ck.template.name == "checkpoint" and ck.tokenizer.id_of("<|im_end|>") in ck.template.stop_token_ids


@pytest.mark.parametrize("messages", CONVERSATIONS)
@pytest.mark.parametrize("gen", [True, False])
def test_its_mlc_template_agrees_with_its_chat_template(
    smollm2_dir: Path, messages: list[Message], gen: bool
) -> None:
    ck = load_checkpoint(smollm2_dir)
    mlc = resolve_prompt_format(ck.tokenizer, ck.info.eos_token_ids, "smollm2", str(smollm2_dir))
    assert mlc.encode(ck.tokenizer, messages, gen) == ck.template.encode(ck.tokenizer, messages, gen)
    assert mlc.stop_token_ids == ck.template.stop_token_ids
    assert load_template("chatml").encode(ck.tokenizer, messages) != ck.template.encode(
        ck.tokenizer, messages
    ) or (messages[0].role == "system")  # plain ChatML lacks SmolLM2's default system prompt


def test_the_engine_answers_as_transformers_does(smollm2_dir: Path) -> None:
    ck = load_checkpoint(smollm2_dir)
    ref = load_checkpoint(smollm2_dir).model
    ids = tuple(ck.template.encode(ck.tokenizer, CONVERSATIONS[0]))
    params = SamplingParams(temperature=0.0, max_tokens=16, stop_token_ids=ck.template.stop_token_ids)
    (s,) = TorchRolloutEngine(ck.model, ck.tokenizer).generate(
        [GenerationRequest(RequestId("q"), ids, params)]
    )
    with torch.no_grad():
        hf = ref.generate(torch.tensor([ids]), max_new_tokens=16, do_sample=False, pad_token_id=2)
    assert list(s.token_ids) == hf[0, len(ids) :].tolist()
    assert s.text.startswith("17 + 25 =")
