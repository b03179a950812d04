"""Chat roles rendered with the served model's own chat template (jinja2 alone, no tokenizer).

The template is rendered for small conversations with a marker as the content; the text around
the marker is each role's prefix and suffix. So `system(...) + user(...) + assistant(gen())`
builds exactly the prompt that the model's chat API builds for those messages.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger(__name__)
ROLES = ("system", "user", "assistant")
_MARK = "\u2063RADIXRT_CONTENT\u2063"  # invisible separators: no template touches them


@dataclass(frozen=True)
class ChatTemplate:
    prefix: dict[str, str]  # role -> text before the content
    suffix: dict[str, str]  # role -> text after the content
    # Inserted before the first turn when it is not a system turn, as the template does
    # (e.g. SmolLM2's "You are a helpful AI assistant named SmolLM ...").
    default_system: str = ""
    default_system_prompt: str | None = None  # its content, for messages(); None if none
    # Stop strings added to every gen, as SGLang's named templates have (e.g. "<|im_end|>"
    # for chatml); a model's own template needs none (its end-of-turn token is its EOS).
    stop_str: tuple[str, ...] = ()
    name: str | None = None  # the SGLang template name, when it is a named one

    @classmethod
    def plain(cls) -> ChatTemplate:
        """For models without a chat template: "role: content" lines."""
        return cls({r: f"{r}: " for r in ROLES}, {r: "\n" for r in ROLES})

    @classmethod
    def from_jinja(
        cls, source: str | None, bos_token: str | None = None, eos_token: str | None = None
    ) -> ChatTemplate:
        if not source:
            return cls.plain()
        render = _renderer(source, bos_token, eos_token)
        turns = [("system", "S"), ("user", "U"), ("assistant", "A")]
        prefix, suffix, before = {}, {}, ""
        for i, (role, content) in enumerate(turns):
            convo = [{"role": r, "content": c} for r, c in turns[:i]]
            full = render(convo + [{"role": role, "content": _MARK}])
            if not full.startswith(before) or full.count(_MARK) != 1:
                logger.warning(
                    "the chat template rewrites earlier turns; rendering roles as "
                    "plain 'role: content' lines instead"
                )
                return cls.plain()
            prefix[role], suffix[role] = full[len(before) :].split(_MARK)
            before = render(convo + [{"role": role, "content": content}])
        head = render([{"role": "user", "content": _MARK}]).split(_MARK)[0]
        return cls(prefix, suffix, *_default_system(head, prefix, suffix))

    def begin(self, role: str) -> str:
        if role not in self.prefix:
            raise ValueError(f"role must be one of {', '.join(ROLES)}, got {role!r}")
        return self.prefix[role]

    def end(self, role: str) -> str:
        return self.suffix[role]


def _default_system(
    head: str, prefix: dict[str, str], suffix: dict[str, str]
) -> tuple[str, str | None]:
    """Out of the text before a lone user turn's content: what precedes the user prefix (the
    default system turn, or just a BOS), and that system turn's content if it is one."""
    if not head.endswith(prefix["user"]):
        return "", None
    lead = head[: len(head) - len(prefix["user"])]
    body = lead[len(prefix["system"]) : len(lead) - len(suffix["system"])]
    if lead.startswith(prefix["system"]) and lead.endswith(suffix["system"]) and body:
        return lead, body
    return lead, None


def _renderer(source: str, bos_token: str | None, eos_token: str | None):
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise ValueError(f"chat template: {message}")

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols]
    )
    env.globals["raise_exception"] = raise_exception
    template = env.from_string(source)

    def render(messages: list[dict[str, Any]]) -> str:
        return template.render(
            messages=messages,
            add_generation_prompt=False,
            bos_token=bos_token or "",
            eos_token=eos_token or "",
        )

    return render
