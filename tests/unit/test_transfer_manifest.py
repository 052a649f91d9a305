"""Manifests of BF16 safetensors bytes: the tensor table, chunk digests, resume and corruption."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.numpy import save

from rlsched.transfer.manifest import (
    Accepted,
    Assembly,
    ManifestError,
    blank,
    build_manifest,
    prefaulted,
    tensors_of,
)


def weights(seed: int = 0, n: int = 5) -> bytes:
    rng = np.random.default_rng(seed)
    state = {f"layers.{i}.weight": rng.standard_normal((i + 3, 17)).astype(np.float16) for i in range(n)}
    return save(state, metadata={"format": "pt"})


def test_the_tensor_table_matches_the_file() -> None:
    blob = weights()
    table = {t.name: t for t in tensors_of(blob)}
    assert set(table) == {f"layers.{i}.weight" for i in range(5)}
    t = table["layers.2.weight"]
    assert (t.dtype, t.shape, t.end - t.start) == ("F16", (5, 17), 5 * 17 * 2)


def test_chunks_cover_the_bytes_with_their_digests() -> None:
    blob = weights()
    m = build_manifest(3, blob, chunk_bytes=100)
    assert sum(c.length for c in m.chunks) == len(blob) and m.chunks[-1].length <= 100
    assert all(xxhash.xxh3_64_intdigest(blob[c.offset : c.offset + c.length]) == c.xxh3 for c in m.chunks)
    assert m.sha256 == hashlib.sha256(blob).hexdigest() and m.version == 3
    assert m.chunk_at(200) == 2
    with pytest.raises(ManifestError, match="not the start of a chunk"):
        m.chunk_at(150)


def test_a_broken_stream_resumes_from_the_last_verified_chunk_and_a_corrupt_chunk_is_refused() -> None:
    blob = weights()
    m = build_manifest(1, blob, chunk_bytes=64)
    a = Assembly(m)
    for c in m.chunks[:3]:
        assert a.accept(c.offset, blob[c.offset : c.offset + c.length]) is Accepted.OK
    assert a.resume_offset == 3 * 64 and not a.confirm()  # the stream broke here
    bad = bytearray(blob[192:256])
    bad[7] ^= 0xFF
    assert a.accept(192, bytes(bad)) is Accepted.CORRUPT and a.resume_offset == 192
    assert a.accept(256, blob[256:320]) is Accepted.OUT_OF_ORDER  # a gap is never accepted
    for c in m.chunks[3:]:
        assert a.accept(c.offset, blob[c.offset : c.offset + c.length]) is Accepted.OK
    assert a.confirm() and bytes(a.buffer) == blob


def test_bytes_that_are_not_safetensors_are_refused_by_name() -> None:
    with pytest.raises(ManifestError, match="too few"):
        build_manifest(1, b"abc")
    with pytest.raises(ManifestError, match="runs past the end"):
        build_manifest(1, (10**6).to_bytes(8, "little") + b"{}")
    with pytest.raises(ManifestError, match="not JSON"):
        build_manifest(1, (4).to_bytes(8, "little") + b"nope")


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 4096), st.integers(0, 3), st.data())
def test_any_chunking_reassembles_exactly_despite_breaks(chunk: int, seed: int, data: st.DataObject) -> None:
    blob = weights(seed, n=3)
    m = build_manifest(0, blob, chunk_bytes=chunk)
    a = Assembly(m)
    while a.resume_offset < len(blob):  # streams that break after a random number of chunks
        start = a.resume_offset
        for c in m.chunks[m.chunk_at(start) : m.chunk_at(start) + data.draw(st.integers(1, 5))]:
            assert a.accept(c.offset, blob[c.offset : c.offset + c.length]) is Accepted.OK
    assert a.confirm() and bytes(a.buffer) == blob


@pytest.mark.parametrize("nbytes", [0, 1, 4095, 4097, (16 << 20) + 3])
def test_blank_and_prefaulted_buffers_are_zeros_of_the_size_and_writable(nbytes: int) -> None:
    for buffer in (blank(nbytes), prefaulted(nbytes)):
        assert len(buffer) == nbytes and bytes(buffer) == bytes(nbytes)
        if nbytes:
            buffer[nbytes - 1 : nbytes] = b"\x07"
            assert buffer[nbytes - 1] == 7
