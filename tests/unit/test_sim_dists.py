"""Scenario distributions: each kind draws what it says, bad ones are refused by name."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from pydantic import TypeAdapter, ValidationError

from rlsched.sim.dists import Distribution, draw, mean

ADAPTER: TypeAdapter[object] = TypeAdapter(Distribution)


def parse(raw: object, base: Path | None = None) -> object:
    return ADAPTER.validate_python(raw, context={"base_dir": base or Path(".")})


@pytest.mark.parametrize(
    "raw",
    [
        0.3,
        {"kind": "uniform", "low": 0.1, "high": 0.5},
        {"kind": "lognormal", "mean": 2.0, "sigma": 0.8},
        {"kind": "pareto", "scale": 1.0, "shape": 3.0},
        {"kind": "empirical", "values": [0.1, 0.2, 0.9]},
        {
            "kind": "mixture",
            "components": [
                {"weight": 3, "dist": 0.1},
                {"weight": 1, "dist": {"kind": "uniform", "low": 4.0, "high": 6.0}},
            ],
        },
    ],
)
def test_sample_mean_matches_the_distribution_mean(raw: object) -> None:
    dist = parse(raw)
    x = draw(dist, np.random.default_rng(0), 200_000)  # type: ignore[arg-type]
    assert x.min() >= 0
    assert x.mean() == pytest.approx(mean(dist), rel=0.03)  # type: ignore[arg-type]


def test_pareto_starts_at_its_scale_and_has_the_right_tail() -> None:
    x = draw(parse({"kind": "pareto", "scale": 2.0, "shape": 1.5}), np.random.default_rng(1), 100_000)  # type: ignore[arg-type]
    assert x.min() >= 2.0
    assert (x > 20.0).mean() == pytest.approx((2.0 / 20.0) ** 1.5, rel=0.1)  # P(X > x) = (scale/x)^shape


def test_bimodal_mixture_has_two_modes_in_proportion() -> None:
    dist = parse(
        {"kind": "mixture", "components": [{"weight": 0.9, "dist": 0.01}, {"weight": 0.1, "dist": 5.0}]}
    )
    x = draw(dist, np.random.default_rng(2), 10_000)  # type: ignore[arg-type]
    assert set(np.unique(x).tolist()) == {0.01, 5.0}
    assert (x == 5.0).mean() == pytest.approx(0.1, abs=0.01)


def test_empirical_from_a_file_relative_to_the_scenario(tmp_path: Path) -> None:
    (tmp_path / "times.txt").write_text("# seconds\n0.5\n1.5, 2.5\n")
    dist = parse({"kind": "empirical", "file": "times.txt"}, base=tmp_path)
    assert dist.values == (0.5, 1.5, 2.5)  # type: ignore[attr-defined]
    assert set(draw(dist, np.random.default_rng(0), 100).tolist()) == {0.5, 1.5, 2.5}  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "raw, needle",
    [
        ({"kind": "empirical", "values": []}, "empty distribution"),
        ({"kind": "empirical"}, "empty distribution"),
        ({"kind": "mixture", "components": []}, "empty distribution"),
        ({"kind": "empirical", "file": "nowhere.txt"}, "does not exist"),
        ({"kind": "constant", "value": -1}, "greater than or equal to 0"),
        ({"kind": "uniform", "low": 2, "high": 1}, "low <= high"),
        ({"kind": "pareto", "scale": 1, "shape": 0}, "greater than 0"),
        ({"kind": "gamma", "value": 1}, "does not match any of the expected tags"),
    ],
)
def test_bad_distributions_are_refused(raw: object, needle: str) -> None:
    with pytest.raises(ValidationError, match=needle):
        parse(raw)


def test_empirical_file_with_words_is_refused(tmp_path: Path) -> None:
    (tmp_path / "bad.txt").write_text("0.5\nslow\n")
    with pytest.raises(ValidationError, match="numbers only"):
        parse({"kind": "empirical", "file": "bad.txt"}, base=tmp_path)
