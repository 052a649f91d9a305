"""Values as plain data: what crosses between a sandboxed solution and the host that judges it.

`encode` accepts only values of exact built-in types (None, bool, int, float, complex, str, bytes,
list, tuple, dict, set, frozenset), never a subclass: an object whose `__eq__` always returns True
cannot cross, and neither can an `int` subclass that lies about itself. JSON carries the result; every
JSON object is a tag (`{"tuple": [...]}`, `{"dict": [[k, v], ...]}`, ...), so a tag cannot be forged
by a dict of the solution's. `decode` builds fresh built-in values on the host, where the comparison
with the reference happens.

This module uses only the standard library: its source is also sent into the sandbox, where the
solution's side of the channel encodes with it.
"""

from __future__ import annotations

import json
from typing import Any

MAX_DEPTH = 100


class NotPlainData(TypeError):
    """A value that cannot cross: a type other than the exact built-ins, or nested too deep."""


def encode(value: Any, depth: int = 0) -> Any:
    if depth > MAX_DEPTH:
        raise NotPlainData(f"nested deeper than {MAX_DEPTH} levels")
    kind = type(value)
    if value is None or kind is bool or kind is int or kind is str:
        return value
    if kind is float:
        finite = value == value and value not in (float("inf"), float("-inf"))
        return value if finite else {"float": repr(value)}
    if kind is list:
        return [encode(v, depth + 1) for v in value]
    if kind is tuple:
        return {"tuple": [encode(v, depth + 1) for v in value]}
    if kind is dict:
        return {"dict": [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in value.items()]}
    if kind is set or kind is frozenset:
        return {kind.__name__: [encode(v, depth + 1) for v in value]}
    if kind is bytes:
        return {"bytes": value.hex()}
    if kind is complex:
        return {"complex": [value.real, value.imag]}
    raise NotPlainData(f"a value of type {kind.__name__} is not plain data")


MAX_NODES = 200_000  # values in one decoded reply: more is refused, not built
# comparisons that building a reply's sets and dicts may cost, counted from their items' hashes before
# any is built: k items sharing a hash cost k(k-1)/2 (each one compared with those before it)
MAX_COLLISION_WORK = 1_000_000


def decode(data: Any) -> Any:
    """Fresh built-in values from `encode`'s output, within a budget of total work: at most
    MAX_NODES values, and sets and dicts whose hash collisions cost at most MAX_COLLISION_WORK
    comparisons in all (a crafted set of colliding ints, half of them sharing one hash, took the host
    18 s to build). Past either, NotPlainData, before the expensive part is done."""
    return _decode(data, [MAX_NODES, MAX_COLLISION_WORK])


def _decode(data: Any, budget: list[int]) -> Any:
    budget[0] -= 1
    if budget[0] < 0:
        raise NotPlainData(f"more than {MAX_NODES} values")
    kind = type(data)
    if data is None or kind in (bool, int, float, str):
        return data
    if kind is list:
        return [_decode(v, budget) for v in data]
    if kind is not dict or len(data) != 1:
        raise NotPlainData(f"not an encoded value: {str(data)[:80]}")
    ((tag, inner),) = data.items()
    match tag:
        case "tuple":
            return tuple(_decode(v, budget) for v in inner)
        case "dict":
            pairs = [(_decode(k, budget), _decode(v, budget)) for k, v in inner]
            _spread([k for k, _ in pairs], budget)
            return dict(pairs)
        case "set":
            return set(_spread([_decode(v, budget) for v in inner], budget))
        case "frozenset":
            return frozenset(_spread([_decode(v, budget) for v in inner], budget))
        case "bytes":
            return bytes.fromhex(inner)
        case "complex":
            return complex(float(inner[0]), float(inner[1]))
        case "float":
            return float(inner)
    raise NotPlainData(f"unknown tag {tag!r}")


def _spread(items: list[Any], budget: list[int]) -> list[Any]:
    """The items, if building a set or dict of them stays within the reply's collision budget."""
    shared: dict[int, int] = {}
    for item in items:
        h = hash(item)
        shared[h] = shared.get(h, 0) + 1
    budget[1] -= sum(k * (k - 1) // 2 for k in shared.values() if k > 1)
    if budget[1] < 0:
        raise NotPlainData(
            f"{len(items)} items whose hash collisions would cost more than {MAX_COLLISION_WORK} comparisons"
        )
    return items


def dumps(value: Any) -> str:
    return json.dumps(encode(value), separators=(",", ":"))


def loads(text: str | bytes) -> Any:
    return decode(json.loads(text))
