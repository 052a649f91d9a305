"""Writing safetensors bytes tensor by tensor into one buffer: the same bytes as the library's."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load, save

from rlsched.model.checkpoint import (
    load_checkpoint,
    published_nbytes,
    published_specs,
    published_state,
    to_bf16_bytes,
)
from rlsched.model.writer import SafetensorsWriter, TensorSpec


def specs(state: dict[str, torch.Tensor]) -> list[TensorSpec]:
    return [TensorSpec(k, v.dtype, tuple(v.shape)) for k, v in state.items()]


def test_the_written_bytes_are_the_librarys_whatever_the_order_of_arrival() -> None:
    gen = torch.Generator().manual_seed(0)
    state = {
        "b.weight": torch.randn(3, generator=gen).bfloat16(),
        "a.weight": torch.randn(2, 2, generator=gen).bfloat16(),
        "norm": torch.randn(5, generator=gen),  # F32 goes first (larger dtype)
        "empty": torch.zeros(0, dtype=torch.bfloat16),
    }
    writer = SafetensorsWriter(specs(state), {"format": "pt"})
    for name in reversed(list(state)):
        assert not writer.done
        writer.put(name, state[name])
    assert writer.done and bytes(writer.buffer) == save(state, metadata={"format": "pt"})


def test_a_model_published_tensor_by_tensor_equals_its_whole_bf16_bytes() -> None:
    model = load_checkpoint(None).model
    state = published_state(model)
    writer = SafetensorsWriter(published_specs(model), {"format": "pt"})
    for name, tensor in state.items():
        writer.put(name, tensor.detach().bfloat16())
    assert bytes(writer.buffer) == to_bf16_bytes(model)
    assert published_nbytes(model) == len(writer.buffer)  # what a receiver sizes its buffer by
    assert load(bytes(writer.buffer)).keys() == state.keys()


def test_a_tensor_outside_the_layout_or_of_another_shape_is_refused() -> None:
    writer = SafetensorsWriter([TensorSpec("w", torch.bfloat16, (2, 2))])
    with pytest.raises(ValueError, match="not in this file's layout"):
        writer.put("v", torch.zeros(2, 2, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="does not match the layout"):
        writer.put("w", torch.zeros(4, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="dtypes outside"):
        SafetensorsWriter([TensorSpec("w", torch.int8, (2,))])
