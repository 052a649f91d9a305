"""Conversation templates, tested token by token: a wrong template silently yields wrong tokens."""

from __future__ import annotations

import jinja2
import pytest

from rlsched.errors import UserError
from rlsched.model.checkpoint import BASE_CHECKPOINT
from rlsched.model.template import (
    ChatTemplate,
    ConvTemplate,
    Message,
    load_template,
    parse_messages,
    resolve_prompt_format,
)
from rlsched.model.tokenizer import Tokenizer

TOK = Tokenizer.from_dir(BASE_CHECKPOINT)
BYTE_OFFSET, IM_START_ID, IM_END_ID = 6, 4, 5
CONVERSATION = [
    Message(role="system", content="Be terse."),
    Message(role="user", content="2+2?"),
    Message(role="assistant", content="4"),
    Message(role="user", content="é?"),
]


def b(text: str) -> list[int]:
    return [BYTE_OFFSET + x for x in text.encode()]


def test_chatml_tokens_exactly() -> None:
    ids = load_template("chatml").encode(TOK, CONVERSATION)
    expected = [
        IM_START_ID,
        *b("system\nBe terse."),
        IM_END_ID,
        *b("\n"),
        IM_START_ID,
        *b("user\n2+2?"),
        IM_END_ID,
        *b("\n"),
        IM_START_ID,
        *b("assistant\n4"),
        IM_END_ID,
        *b("\n"),
        IM_START_ID,
        *b("user\né?"),
        IM_END_ID,
        *b("\n"),
        IM_START_ID,
        *b("assistant\n"),
    ]
    assert ids == expected


def test_chatml_without_system_message_has_no_system_block() -> None:
    text = load_template("chatml").render([Message(role="user", content="hi")])
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_llama2_text_exactly() -> None:
    text = load_template("llama-2").render(CONVERSATION)
    # the system block replaces the first user turn's role prefix (add_role_after_system_message false)
    assert text == "[INST] <<SYS>>\nBe terse.\n<</SYS>>\n\n2+2? [/INST] 4 [INST] é? [/INST] "
    default = load_template("llama-2").render([Message(role="user", content="hi")])
    assert default.startswith("[INST] <<SYS>>\nYou are a helpful")


def test_generation_prompt_is_optional() -> None:
    t = load_template("chatml")
    msgs = [Message(role="user", content="hi")]
    assert t.render(msgs) == t.render(msgs, add_generation_prompt=False) + "<|im_start|>assistant\n"


def test_a_wrong_template_gives_different_tokens() -> None:
    right = load_template("chatml")
    wrong = right.model_copy(update={"role_content_sep": ""})  # a one-character slip
    assert wrong.encode(TOK, CONVERSATION) != right.encode(TOK, CONVERSATION)
    swapped = right.model_copy(update={"seps": ("\n<|im_end|>",)})
    assert swapped.encode(TOK, CONVERSATION) != right.encode(TOK, CONVERSATION)


@pytest.mark.parametrize("name", ["chatml", "llama-2"])
@pytest.mark.parametrize("gen", [True, False])
def test_jinja_chat_template_agrees(name: str, gen: bool) -> None:
    t = load_template(name)
    env = jinja2.Environment()
    env.globals["raise_exception"] = lambda msg: (_ for _ in ()).throw(ValueError(msg))
    jinja = env.from_string(t.to_jinja())
    for msgs in (CONVERSATION, CONVERSATION[1:], CONVERSATION[1:2]):
        rendered = jinja.render(messages=[m.model_dump() for m in msgs], add_generation_prompt=gen)
        assert TOK.encode(rendered) == t.encode(TOK, msgs, gen)


def test_system_prefix_token_ids_are_prepended() -> None:
    t = load_template("chatml").model_copy(update={"system_prefix_token_ids": (1,)})
    assert t.encode(TOK, [Message(role="user", content="x")])[0] == 1


def test_bad_templates_and_messages() -> None:
    with pytest.raises(UserError, match="not found; available: chatml, llama-2, smollm2"):
        load_template("no-such-template")
    with pytest.raises(ValueError, match="seps"):
        ConvTemplate(name="x", roles={"user": "u", "assistant": "a"}, seps=())
    with pytest.raises(UserError, match="may only come first"):
        load_template("chatml").render(
            [Message(role="user", content="a"), Message(role="system", content="b")]
        )
    with pytest.raises(UserError, match="not valid JSON"):
        parse_messages("[{")
    with pytest.raises(UserError, match="role"):
        parse_messages('[{"role": "wizard", "content": "x"}]')


@pytest.mark.parametrize("msgs", [CONVERSATION, CONVERSATION[1:], CONVERSATION[1:2]])
def test_the_base_checkpoints_chat_template_is_chatml_token_for_token(msgs: list[Message]) -> None:
    own = ChatTemplate(TOK, (2, 5))
    assert own.encode(TOK, msgs) == load_template("chatml").encode(TOK, msgs)


def test_stop_ids_come_from_the_tokenizer_and_the_checkpoints_eos() -> None:
    chatml = resolve_prompt_format(TOK, (2,), "chatml", "base")
    assert isinstance(chatml, ConvTemplate) and chatml.stop_token_ids == (2, IM_END_ID)  # <|im_end|> by text
    own = resolve_prompt_format(TOK, (2, 5), None, "base")
    assert isinstance(own, ChatTemplate) and own.stop_token_ids == (2, 5)


def test_no_chat_template_and_no_mlc_template_is_refused() -> None:
    bare = Tokenizer(TOK.hf)
    bare.hf = TOK.hf.__class__(tokenizer_object=TOK.hf.backend_tokenizer)  # the same vocabulary, no template
    with pytest.raises(UserError, match=r"no chat template .* set model\.template to one of"):
        resolve_prompt_format(bare, (2,), None, "somewhere")
