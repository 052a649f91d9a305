"""A prefix cache for the torch engine: the keys and values of token blocks already computed, kept
in a pool and copied into a newcomer's cache row instead of being computed again.

Sequences are cut into blocks of `block` tokens. A block is known by its parent block and its own
tokens (the dict key is exactly that, so two prefixes share an entry only if every token up to it
is the same: no hash can collide). A newcomer's prompt is looked up block by block from its start;
the run of blocks found is copied into its row and only the rest of the prompt is prefilled
(`kv_attention`'s extend step), which is what `prompt_tokens_details.cached_tokens` reports. Full
blocks are remembered after each prefill and when a sequence finishes (its output too, so the next
turn of a conversation finds the last one), least recently used evicted first. A new weight version
empties the cache: keys and values computed under other weights are not this model's.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from rlsched.engine.kv_attention import SlotCache

BLOCK = 16


@dataclass(slots=True)
class _Entry:
    id: int
    slot: int  # its place in the pool


class PrefixCache:
    def __init__(self, capacity_blocks: int, block: int = BLOCK) -> None:
        if capacity_blocks < 1:
            raise ValueError("a prefix cache needs room for at least one block")
        self.capacity = capacity_blocks
        self.block = block
        self._entries: OrderedDict[tuple[int, tuple[int, ...]], _Entry] = OrderedDict()
        self._free: list[int] = list(range(capacity_blocks - 1, -1, -1))
        self._next_id = 1
        self._k: list[torch.Tensor] = []
        self._v: list[torch.Tensor] = []
        self.hits = 0  # tokens served from the cache, in all
        self.queries = 0  # prompt tokens looked up, in all

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        """Forget every block (a new weight version); the pool's memory is kept."""
        self._entries.clear()
        self._free = list(range(self.capacity - 1, -1, -1))

    def lookup(self, tokens: Sequence[int], limit: int) -> list[int]:
        """Pool slots of the leading blocks of `tokens` that are cached, covering at most `limit`
        tokens (the engine leaves at least the last prompt token to compute)."""
        slots: list[int] = []
        parent = 0
        b = self.block
        for start in range(0, max(limit, 0) - b + 1, b):
            entry = self._entries.get((parent, tuple(tokens[start : start + b])))
            if entry is None:
                break
            self._entries.move_to_end((parent, tuple(tokens[start : start + b])))
            slots.append(entry.slot)
            parent = entry.id
        self.queries += len(tokens)
        self.hits += len(slots) * b
        return slots

    def load(self, cache: SlotCache, row: int, at: int, slots: list[int]) -> None:
        """Copy the blocks in `slots` into `row` of `cache`, from slot `at` on."""
        n = len(slots) * self.block
        index = torch.tensor(slots, device=self._k[0].device)
        for mine, pool in zip((*cache.k, *cache.v), (*self._k, *self._v), strict=True):
            blocks = pool.index_select(0, index)  # [n_blocks, kv, block, dim]
            mine[row, :, at : at + n] = blocks.transpose(0, 1).reshape(mine.shape[1], n, mine.shape[3])

    def store(self, tokens: Sequence[int], cache: SlotCache, row: int, base: int) -> None:
        """Remember the full blocks of `tokens`, whose keys and values lie in `row` of `cache` from
        slot `base` on (blocks already known are only marked as used)."""
        b = self.block
        parent = 0
        fresh = self._next_id  # entries made by this call are never evicted by it
        new: list[tuple[int, int]] = []  # (block number, pool slot)
        for k in range(len(tokens) // b):
            key = (parent, tuple(tokens[k * b : (k + 1) * b]))
            entry = self._entries.get(key)
            if entry is None:
                slot = self._take_slot(fresh)
                if slot is None:
                    break
                entry = _Entry(self._next_id, slot)
                self._next_id += 1
                self._entries[key] = entry
                new.append((k, slot))
            else:
                self._entries.move_to_end(key)
            parent = entry.id
        if new:
            self._write(cache, row, base, new)

    def _take_slot(self, fresh: int) -> int | None:
        """A free pool slot, or the least recently used entry's (None if all are this call's)."""
        if self._free:
            return self._free.pop()
        key, entry = next(iter(self._entries.items()))
        if entry.id >= fresh:
            return None
        del self._entries[key]
        return entry.slot

    def _write(self, cache: SlotCache, row: int, base: int, new: list[tuple[int, int]]) -> None:
        if not self._k:
            _, kv, _, dim = cache.k[0].shape
            shape = (self.capacity, kv, self.block, dim)
            like = cache.k[0]
            self._k = [torch.zeros(shape, dtype=like.dtype, device=like.device) for _ in cache.k]
            self._v = [torch.zeros(shape, dtype=like.dtype, device=like.device) for _ in cache.v]
        b = self.block
        index = torch.tensor([slot for _, slot in new], device=self._k[0].device)
        for mine, pool in zip((*cache.k, *cache.v), (*self._k, *self._v), strict=True):
            blocks = torch.stack([mine[row, :, base + k * b : base + (k + 1) * b] for k, _ in new])
            pool.index_copy_(0, index, blocks)
