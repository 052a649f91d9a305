"""Distributions of durations (and token counts) for scenarios: typed, validated once, drawn in bulk.

Each kind is a small frozen model named by its `kind`, so a scenario reads as what it means:

    {kind: constant, value: 0.5}            {kind: uniform, low: 0.1, high: 0.5}
    {kind: lognormal, mean: 2.0, sigma: 0.8}  # the mean in seconds, sigma of the underlying normal
    {kind: pareto, scale: 0.2, shape: 1.5}    # minimum `scale`, tail index `shape` (heavy when small)
    {kind: empirical, values: [0.1, 0.4]}     # or {kind: empirical, file: times.txt}
    {kind: mixture, components: [{weight: 0.9, dist: {...}}, {weight: 0.1, dist: {...}}]}

A bare number means `constant`. An empirical file holds numbers separated by whitespace, commas or
newlines (a JSON list works too; `#` starts a comment); a relative path is read from the scenario's
directory. Draws go through one `numpy.random.Generator`, so a run is a function of its seed.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationInfo, model_validator


class _Dist(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Constant(_Dist):
    kind: Literal["constant"] = "constant"
    value: float = Field(ge=0)


class Uniform(_Dist):
    kind: Literal["uniform"] = "uniform"
    low: float = Field(ge=0)
    high: float = Field(ge=0)

    @model_validator(mode="after")
    def _ordered(self) -> Uniform:
        if self.high < self.low:
            raise ValueError(f"uniform needs low <= high (got low {self.low}, high {self.high})")
        return self


class Lognormal(_Dist):
    kind: Literal["lognormal"] = "lognormal"
    mean: float = Field(gt=0, description="mean of the distribution itself, in its own unit")
    sigma: float = Field(ge=0, description="standard deviation of the underlying normal")


class Pareto(_Dist):
    kind: Literal["pareto"] = "pareto"
    scale: float = Field(gt=0, description="the minimum value")
    shape: float = Field(gt=0, description="tail index alpha; the mean is infinite when alpha <= 1")


def _numbers_in(path: Path) -> tuple[float, ...]:
    text = "\n".join(line.split("#", 1)[0] for line in path.read_text().splitlines())
    words = [w for w in re.split(r"[\s,\[\]]+", text) if w]
    try:
        return tuple(float(w) for w in words)
    except ValueError as err:
        raise ValueError(f"{path} must hold numbers only ({err})") from None


class Empirical(_Dist):
    """Draws, with replacement, from observed values (e.g. fitted from a runtime's spans)."""

    kind: Literal["empirical"] = "empirical"
    values: tuple[Annotated[float, Field(ge=0)], ...] = ()
    file: Path | None = Field(None, description="numbers to read into `values` (relative: scenario's dir)")

    @model_validator(mode="after")
    def _load(self, info: ValidationInfo) -> Empirical:
        if self.file is not None:
            if self.values:
                raise ValueError("give either values or file, not both")
            base = Path((info.context or {}).get("base_dir", "."))
            path = self.file if self.file.is_absolute() else base / self.file
            if not path.is_file():
                raise ValueError(f"empirical file {path} does not exist")
            values = _numbers_in(path)
            if any(v < 0 for v in values):
                raise ValueError(f"{path} holds a negative value; durations must be non-negative")
            object.__setattr__(self, "values", values)
        if not self.values:
            raise ValueError("empty distribution: an empirical distribution needs at least one value")
        return self


Simple = Annotated[Constant | Uniform | Lognormal | Pareto | Empirical, Field(discriminator="kind")]


def _number_is_constant(raw: Any) -> Any:
    return {"kind": "constant", "value": raw} if isinstance(raw, int | float) else raw


class Component(_Dist):
    weight: float = Field(gt=0)
    dist: Annotated[Simple, BeforeValidator(_number_is_constant)]


class Mixture(_Dist):
    """With probability proportional to `weight`, a draw comes from that component (e.g. bimodal)."""

    kind: Literal["mixture"] = "mixture"
    components: tuple[Component, ...] = ()

    @model_validator(mode="after")
    def _nonempty(self) -> Mixture:
        if not self.components:
            raise ValueError("empty distribution: a mixture needs at least one component")
        return self


AnyDist = Constant | Uniform | Lognormal | Pareto | Empirical | Mixture
Distribution = Annotated[
    AnyDist,
    Field(discriminator="kind"),
    BeforeValidator(_number_is_constant),
]


def draw(dist: AnyDist, rng: np.random.Generator, n: int) -> np.ndarray:
    """`n` independent draws."""
    match dist:
        case Constant():
            return np.full(n, dist.value)
        case Uniform():
            return rng.uniform(dist.low, dist.high, n)
        case Lognormal():  # parameterised by its mean: mu = ln(mean) - sigma^2 / 2
            return rng.lognormal(np.log(dist.mean) - dist.sigma**2 / 2, dist.sigma, n)
        case Pareto():  # numpy's pareto is Lomax (shifted to start at 0): (1 + X) * scale is Pareto I
            return (rng.pareto(dist.shape, n) + 1.0) * dist.scale
        case Empirical():
            return rng.choice(np.asarray(dist.values, dtype=float), n)
        case Mixture():
            weights = np.array([c.weight for c in dist.components])
            pick = rng.choice(len(weights), n, p=weights / weights.sum())
            out = np.empty(n)
            for k, component in enumerate(dist.components):
                chosen = pick == k
                out[chosen] = draw(component.dist, rng, int(chosen.sum()))
            return out


def mean(dist: AnyDist) -> float:
    """The distribution's mean (infinite for a Pareto with shape <= 1)."""
    match dist:
        case Constant():
            return dist.value
        case Uniform():
            return (dist.low + dist.high) / 2
        case Lognormal():
            return dist.mean
        case Pareto():
            return dist.shape * dist.scale / (dist.shape - 1) if dist.shape > 1 else float("inf")
        case Empirical():
            return float(np.mean(dist.values))
        case Mixture():
            total = sum(c.weight for c in dist.components)
            return sum(c.weight * mean(c.dist) for c in dist.components) / total
