"""When a transient rollout instance is worth having: its usable window, and the break-even
throughput that makes added capacity lower the cost per unit of work (SPEC section 2).

An instance available for `L` seconds that needs `T0` to prepare (weights over the link, load,
confirm) generates for `max(L - T0, 0)` seconds: 20 s with 8 s of preparation gives 12 s, 5 s gives
nothing; at 100 useful tokens/s, lifetimes of 10, 20 and 40 s yield 200, 1,200 and 3,200 tokens.
Adding instances at cost `C_i` to a base at cost `C` pays only once throughput rises above
`(C + sum C_i) / C` (84 per hour plus six at 5.30: about 1.38x; at 1.2x throughput the cost per
unit of work is about 1.15x, at 1.6x about 0.86x). Pure arithmetic.
"""

from __future__ import annotations

from collections.abc import Sequence


def usable_s(available_s: float, prepare_s: float) -> float:
    """Seconds of generation in a window of `available_s` after `prepare_s` of preparation."""
    if available_s < 0 or prepare_s < 0:
        raise ValueError("the window and the preparation time must be non-negative")
    return max(available_s - prepare_s, 0.0)


def useful_tokens(available_s: float, prepare_s: float, tokens_per_s: float) -> float:
    if tokens_per_s < 0:
        raise ValueError("the token rate must be non-negative")
    return usable_s(available_s, prepare_s) * tokens_per_s


def breakeven(base_cost: float, added_costs: Sequence[float]) -> float:
    """The throughput multiple above which the added capacity lowers the cost per unit of work."""
    if base_cost <= 0 or any(c < 0 for c in added_costs):
        raise ValueError("the base cost must be positive and added costs non-negative")
    return (base_cost + sum(added_costs)) / base_cost


def relative_cost_per_work(base_cost: float, added_costs: Sequence[float], throughput: float) -> float:
    """Cost per unit of work with the added capacity, against the base alone, at a throughput multiple."""
    if throughput <= 0:
        raise ValueError("the throughput multiple must be positive")
    return breakeven(base_cost, added_costs) / throughput
