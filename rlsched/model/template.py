"""Prompt formats: a checkpoint's own chat template, or an MLC-style `conv_template`.

A job's prompts come from the checkpoint's chat template by default (`ChatTemplate`: the Jinja
template in its tokenizer files, applied by transformers with `add_generation_prompt`), as vLLM and
every peer framework do. An MLC template (`ConvTemplate`, `configs/templates/NAME.json`, chosen with
`model.template`) serves checkpoints that have none, and `rlsched template render`. Both render
messages to text, which the tokenizer encodes without adding special tokens, and both say which
token ids end an assistant turn (`resolve_prompt_format` adds the checkpoint's EOS ids and the ids
of single-token stop strings, so a template's stops need no ids of a particular vocabulary).

MLC templates: messages -> prompt text -> token ids.

A template (`configs/templates/NAME.json`) names a system template with a `{system_message}`
placeholder, the role strings, role templates (`{user_message}`, ...), one or two separators
(after user and assistant turns), the role/content and empty-role separators, and the stop strings
and stop token ids that end an assistant turn. Rendering follows MLC's `Conversation.as_prompt`:

    system + role + role_content_sep + content + sep[0 or 1] + ... + assistant_role + role_empty_sep

Departures from MLC, both made so that the Jinja `chat_template` written into a checkpoint (which
transformers and vLLM apply) renders exactly the same text:
- an empty system message leaves the system block out (as Hugging Face's ChatML templates do);
- a leading message with role `system` replaces the template's system message (OpenAI style).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from rlsched.errors import UserError
from rlsched.model.tokenizer import Tokenizer

TEMPLATE_DIR = Path(__file__).resolve().parents[2] / "configs" / "templates"
ROLE_PLACEHOLDERS = {"user": "{user_message}", "assistant": "{assistant_message}", "tool": "{tool_message}"}

Role = Literal["system", "user", "assistant", "tool"]


class Message(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    role: Role
    content: str


class ConvTemplate(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    system_template: str = "{system_message}"
    system_message: str = ""
    system_prefix_token_ids: tuple[int, ...] = ()
    add_role_after_system_message: bool = True
    roles: dict[str, str]
    role_templates: dict[str, str] = Field(default_factory=dict)
    seps: tuple[str, ...]
    role_content_sep: str = ""
    role_empty_sep: str = ""
    stop_str: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    function_string: str = ""
    use_function_calling: bool = False

    @field_validator("seps")
    @classmethod
    def _one_or_two_seps(cls, seps: tuple[str, ...]) -> tuple[str, ...]:
        if len(seps) not in (1, 2):
            raise ValueError("seps must hold 1 or 2 separators (after user turns, after assistant turns)")
        return seps

    @model_validator(mode="after")
    def _roles_complete(self) -> ConvTemplate:
        missing = {"user", "assistant"} - set(self.roles)
        if missing:
            raise ValueError(f"roles must name {sorted(missing)}")
        if "{system_message}" not in self.system_template:
            raise ValueError("system_template must contain the {system_message} placeholder")
        return self

    # -- rendering -------------------------------------------------------------------------------

    def _sep(self, role: str) -> str:
        return self.seps[1] if role == "assistant" and len(self.seps) == 2 else self.seps[0]

    def _role_template(self, role: str) -> str:
        return self.role_templates.get(role, ROLE_PLACEHOLDERS.get(role, "{message}"))

    def _system_and_turns(self, messages: Sequence[Message]) -> tuple[str, list[Message]]:
        turns = list(messages)
        system = self.system_message
        if turns and turns[0].role == "system":
            system = turns.pop(0).content
        for m in turns:
            if m.role == "system":
                raise UserError("a system message may only come first in the conversation")
            if m.role not in self.roles:
                raise UserError(
                    f"template {self.name!r} has no role {m.role!r}; its roles are {sorted(self.roles)}"
                )
        return system, turns

    def render(self, messages: Sequence[Message], add_generation_prompt: bool = True) -> str:
        system, turns = self._system_and_turns(messages)
        parts = [self.system_template.replace("{system_message}", system)] if system else []
        for i, m in enumerate(turns):
            omit_role = bool(system) and i == 0 and not self.add_role_after_system_message
            prefix = "" if omit_role else self.roles[m.role] + self.role_content_sep
            body = self._role_template(m.role).replace(ROLE_PLACEHOLDERS.get(m.role, "{message}"), m.content)
            parts.append(prefix + body + self._sep(m.role))
        if add_generation_prompt:
            parts.append(self.roles["assistant"] + self.role_empty_sep)
        return "".join(parts)

    def encode(
        self, tokenizer: Tokenizer, messages: Sequence[Message], add_generation_prompt: bool = True
    ) -> list[int]:
        return list(self.system_prefix_token_ids) + tokenizer.encode(
            self.render(messages, add_generation_prompt)
        )

    def to_jinja(self) -> str:
        """A Hugging Face `chat_template` that renders exactly what `render` does."""
        q = _jinja_literal
        lines = [
            "{%- set ns = namespace(system=" + q(self.system_message) + ", turns=messages) -%}",
            "{%- if messages and messages[0]['role'] == 'system' -%}"
            "{%- set ns.system = messages[0]['content'] -%}{%- set ns.turns = messages[1:] -%}"
            "{%- endif -%}",
        ]
        sys_pre, sys_post = self.system_template.split("{system_message}", 1)
        lines.append(
            "{%- if ns.system -%}{{ " + q(sys_pre) + " + ns.system + " + q(sys_post) + " }}{%- endif -%}"
        )
        lines.append("{%- for m in ns.turns -%}")
        for k, role in enumerate(sorted(self.roles)):
            pre, post = self._role_template(role).split(ROLE_PLACEHOLDERS.get(role, "{message}"), 1)
            head = q(self.roles[role] + self.role_content_sep)
            if not self.add_role_after_system_message:
                head = f"('' if (ns.system and loop.first) else {head})"
            keyword = "if" if k == 0 else "elif"
            lines.append(
                f"{{%- {keyword} m['role'] == {q(role)} -%}}"
                f"{{{{ {head} + {q(pre)} + m['content'] + {q(post + self._sep(role))} }}}}"
            )
        lines.append("{%- else -%}{{ raise_exception('unsupported role: ' + m['role']) }}")
        lines.append("{%- endif -%}{%- endfor -%}")
        gen = q(self.roles["assistant"] + self.role_empty_sep)
        lines.append("{%- if add_generation_prompt -%}{{ " + gen + " }}{%- endif -%}")
        return "\n".join(lines)


class ChatTemplate:
    """A checkpoint's own chat template (Jinja, from its tokenizer files), applied by transformers."""

    def __init__(
        self, tokenizer: Tokenizer, stop_token_ids: tuple[int, ...], name: str = "checkpoint"
    ) -> None:
        if tokenizer.chat_template is None:
            raise ValueError("the tokenizer has no chat template")
        self._tok = tokenizer
        self.name = name
        self.stop_str: tuple[str, ...] = ()
        self.stop_token_ids = stop_token_ids

    def render(self, messages: Sequence[Message], add_generation_prompt: bool = True) -> str:
        try:
            text = self._tok.hf.apply_chat_template(
                [m.model_dump() for m in messages],
                tokenize=False,
                add_generation_prompt=add_generation_prompt,
            )
        except Exception as err:  # noqa: BLE001 - a template's raise_exception() is bad input
            raise UserError(f"the checkpoint's chat template refused the messages: {err}") from None
        return str(text)

    def encode(
        self, tokenizer: Tokenizer, messages: Sequence[Message], add_generation_prompt: bool = True
    ) -> list[int]:
        return tokenizer.encode(self.render(messages, add_generation_prompt))


PromptFormat = ConvTemplate | ChatTemplate


def resolve_prompt_format(
    tokenizer: Tokenizer, eos_token_ids: Sequence[int], template: str | None, source: str
) -> PromptFormat:
    """The checkpoint's chat template, or the MLC template `template` names; with the token ids that
    end a turn: the checkpoint's EOS ids, the template's own ids and its single-token stop strings."""
    if template is None:
        if tokenizer.chat_template is None:
            raise UserError(
                f"checkpoint {source} has no chat template (no chat_template.jinja, none in "
                "tokenizer_config.json) and model.template is not set; set model.template to one of "
                f"{', '.join(available_templates())} (configs/templates/), or add a chat template to "
                "the checkpoint"
            )
        return ChatTemplate(tokenizer, tuple(sorted(set(eos_token_ids))))
    conv = load_template(template)
    stops = set(conv.stop_token_ids) | set(eos_token_ids)
    stops |= {i for s in conv.stop_str if (i := tokenizer.id_of(s)) is not None}
    return conv.model_copy(update={"stop_token_ids": tuple(sorted(stops))})


def _jinja_literal(s: str) -> str:
    return json.dumps(s, ensure_ascii=False)


def available_templates() -> list[str]:
    return sorted(p.stem for p in TEMPLATE_DIR.glob("*.json"))


def load_template(name_or_path: str) -> ConvTemplate:
    """Load `configs/templates/NAME.json` or a template file given by path."""
    path = Path(name_or_path)
    if not path.suffix:
        path = TEMPLATE_DIR / f"{name_or_path}.json"
    if not path.is_file():
        raise UserError(
            f"conversation template {name_or_path!r} not found; available: "
            f"{', '.join(available_templates())} (or give the path of a template JSON file)"
        )
    try:
        return ConvTemplate.model_validate_json(path.read_text())
    except ValidationError as err:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or '(top)'}: {e['msg']}" for e in err.errors())
        raise UserError(f"conversation template {path} is invalid: {problems}") from None


def parse_messages(raw: str) -> list[Message]:
    """Messages from a JSON list of {"role", "content"} objects (the OpenAI shape)."""
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as err:
        raise UserError(f"--messages is not valid JSON ({err.msg} at position {err.pos})") from None
    if not isinstance(data, list):
        raise UserError('--messages must be a JSON list like [{"role": "user", "content": "hi"}]')
    try:
        return [Message.model_validate(m) for m in data]
    except ValidationError as err:
        first = err.errors()[0]
        raise UserError(
            f"--messages: {first['msg']} at {'.'.join(map(str, first['loc']))}; each message needs "
            "'role' (system, user, assistant, tool) and 'content' (a string)"
        ) from None
