"""Prompt/chat templates as data: a small registry keyed by name.

Contract: a template turns a list of user turns (and the assistant replies already given) into
one prompt string ending where the assistant's next reply starts. Templates are plain strings
with ``{content}`` slots, never code copied per model. Per-model differences (which template,
which EOS text) are looked up here by name; nothing here knows about token ids.

:data:`AUTO` (``template: auto`` on a pair) takes the format from the pair's own tokenizer
(``tokenizer.apply_chat_template``, its ``chat_template``) instead of this registry: a checkpoint
with a chat format not listed here needs no code edit. :func:`render_prompt` is the one entry point
that accepts either.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

AUTO = "auto"  # the template a tokenizer carries (HF ``chat_template``), not a registry entry


class ChatTokenizer(Protocol):
    """What :data:`AUTO` needs of a tokenizer (any Hugging Face tokenizer has both)."""

    chat_template: Any

    def apply_chat_template(self, conversation: list[dict[str, str]], **kwargs: Any) -> Any: ...


@dataclass(frozen=True)
class ChatTemplate:
    """One chat format. Each ``*_turn`` string has a single ``{content}`` slot."""

    name: str
    system_turn: str
    user_turn: str
    assistant_turn: str
    assistant_prefix: str
    eos_text: str
    default_system: str = ""


TEMPLATES: dict[str, ChatTemplate] = {
    # The zoo's own format: plain text markers the BPE learns as a few tokens.
    "zoo": ChatTemplate(
        name="zoo",
        system_turn="### System:\n{content}\n\n",
        user_turn="### User:\n{content}\n\n",
        assistant_turn="### Assistant:\n{content}<|endoftext|>\n\n",
        assistant_prefix="### Assistant:\n",
        eos_text="<|endoftext|>",
    ),
    # ChatML, as used by the Qwen2.5 / Qwen3 instruct checkpoints (the real pair).
    "chatml": ChatTemplate(
        name="chatml",
        system_turn="<|im_start|>system\n{content}<|im_end|>\n",
        user_turn="<|im_start|>user\n{content}<|im_end|>\n",
        assistant_turn="<|im_start|>assistant\n{content}<|im_end|>\n",
        assistant_prefix="<|im_start|>assistant\n",
        eos_text="<|im_end|>",
        default_system="You are a helpful assistant.",
    ),
    # Llama-3 instruct header format.
    "llama3": ChatTemplate(
        name="llama3",
        system_turn="<|start_header_id|>system<|end_header_id|>\n\n{content}<|eot_id|>",
        user_turn="<|start_header_id|>user<|end_header_id|>\n\n{content}<|eot_id|>",
        assistant_turn="<|start_header_id|>assistant<|end_header_id|>\n\n{content}<|eot_id|>",
        assistant_prefix="<|start_header_id|>assistant<|end_header_id|>\n\n",
        eos_text="<|eot_id|>",
    ),
    # No chat markup: turns joined by blank lines (base models).
    "plain": ChatTemplate(
        name="plain",
        system_turn="{content}\n\n",
        user_turn="{content}\n\n",
        assistant_turn="{content}\n\n",
        assistant_prefix="",
        eos_text="<|endoftext|>",
    ),
}


def get_template(name: str) -> ChatTemplate:
    """Look a template up by name; the error lists the known names."""
    try:
        return TEMPLATES[name]
    except KeyError:
        raise KeyError(f"unknown chat template {name!r}; known: {sorted(TEMPLATES)}") from None


def render(
    template: ChatTemplate | str,
    user_turns: Sequence[str],
    assistant_turns: Sequence[str] = (),
    system: str | None = None,
) -> str:
    """Render a conversation up to the start of the next assistant reply.

    ``assistant_turns`` holds the replies to all but the last user turn (multi-turn prompts such
    as MT-Bench's second turn); it may not be longer than ``len(user_turns) - 1``.
    """
    tpl = get_template(template) if isinstance(template, str) else template
    if not user_turns:
        raise ValueError("render needs at least one user turn")
    if len(assistant_turns) > len(user_turns) - 1:
        raise ValueError(
            f"{len(assistant_turns)} assistant turns for {len(user_turns)} user turns: "
            "the prompt must end with a user turn"
        )
    system_text = tpl.default_system if system is None else system
    parts = [tpl.system_turn.format(content=system_text)] if system_text else []
    for i, user in enumerate(user_turns):
        parts.append(tpl.user_turn.format(content=user))
        if i < len(assistant_turns):
            parts.append(tpl.assistant_turn.format(content=assistant_turns[i]))
    parts.append(tpl.assistant_prefix)
    return "".join(parts)


def render_prompt(
    template: str,
    user_turns: Sequence[str],
    tokenizer: ChatTokenizer | None = None,
    assistant_turns: Sequence[str] = (),
    system: str | None = None,
) -> str:
    """:func:`render` for a registry name, or the tokenizer's own chat template for :data:`AUTO`."""
    if template != AUTO:
        return render(template, user_turns, assistant_turns, system)
    if tokenizer is None:
        raise ValueError("chat template 'auto' takes the format from a tokenizer: none was given")
    if not getattr(tokenizer, "chat_template", None):
        name = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
        raise ValueError(
            f"chat template 'auto': the tokenizer {name!r} has no chat_template; "
            f"set the pair's template to one of {sorted(TEMPLATES)}"
        )
    if not user_turns or len(assistant_turns) > len(user_turns) - 1:
        raise ValueError(
            f"{len(assistant_turns)} assistant turns for {len(user_turns)} user turns: "
            "the prompt must end with a user turn"
        )
    messages = [{"role": "system", "content": system}] if system else []
    for i, user in enumerate(user_turns):
        messages.append({"role": "user", "content": user})
        if i < len(assistant_turns):
            messages.append({"role": "assistant", "content": assistant_turns[i]})
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return str(text)


def jinja_chat_template(template: ChatTemplate | str) -> str:
    """The same template as a Jinja string for ``tokenizer.chat_template`` (HF tokenizers)."""
    tpl = get_template(template) if isinstance(template, str) else template

    def jinja(s: str, var: str) -> str:
        head, tail = s.split("{content}")
        return f"{{{{ {head!r} + {var} + {tail!r} }}}}"

    var = "m['content']"
    return (
        "{% for m in messages %}"
        f"{{% if m['role'] == 'system' %}}{jinja(tpl.system_turn, var)}"
        f"{{% elif m['role'] == 'user' %}}{jinja(tpl.user_turn, var)}"
        f"{{% else %}}{jinja(tpl.assistant_turn, var)}{{% endif %}}"
        "{% endfor %}"
        f"{{% if add_generation_prompt %}}{{{{ {tpl.assistant_prefix!r} }}}}{{% endif %}}"
    )
