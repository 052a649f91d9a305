"""Component fixtures: a small random-weight model (fast, no shipped checkpoint needed)."""

from __future__ import annotations

import pytest
import torch

from rlsched.engine.torch_engine import TorchRolloutEngine
from rlsched.model.llama import LlamaConfig, LlamaForCausalLM
from rlsched.model.tokenizer import ByteTokenizer


@pytest.fixture(scope="session", autouse=True)
def _threads() -> None:
    torch.set_num_threads(2)


@pytest.fixture(scope="session")
def tiny_model() -> LlamaForCausalLM:
    model = LlamaForCausalLM(LlamaConfig(num_hidden_layers=2, max_position_embeddings=96))
    model.init_weights(seed=7)
    # larger weights than a fresh init so that sampled sequences vary and logits are not flat
    with torch.no_grad():
        model.lm_head.weight.mul_(20)
    return model.eval()


@pytest.fixture()
def engine(tiny_model: LlamaForCausalLM) -> TorchRolloutEngine:
    return TorchRolloutEngine(tiny_model, ByteTokenizer(), max_batch=64, seed=3)
