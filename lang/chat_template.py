"""Chat roles rendered with the served model's own chat template (jinja2 alone, no tokenizer).

The template is rendered for small conversations with a marker as the content; the text around
the marker is each role's prefix and suffix. So `system(...) + user(...) + assistant(gen())`
builds exactly the prompt that the model's chat API builds for those messages.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

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

    @classmethod
    def plain(cls) -> "ChatTemplate":
        """For models without a chat template: "role: content" lines."""
        return cls({r: f"{r}: " for r in ROLES}, {r: "\n" for r in ROLES})

    @classmethod
    def from_jinja(cls, source: str | None, bos_token: str | None = None,
                   eos_token: str | None = None) -> "ChatTemplate":
        if not source:
            return cls.plain()
        render = _renderer(source, bos_token, eos_token)
        turns = [("system", "S"), ("user", "U"), ("assistant", "A")]
        prefix, suffix, before = {}, {}, ""
        for i, (role, _) in enumerate(turns):
            convo = [{"role": r, "content": c} for r, c in turns[:i]]
            full = render(convo + [{"role": role, "content": _MARK}])
            if not full.startswith(before) or full.count(_MARK) != 1:
                return cls.plain()  # a template that rewrites earlier turns: no fixed affixes
            turn = full[len(before):]
            prefix[role], suffix[role] = turn.split(_MARK)
            before = render(convo + [{"role": role, "content": turns[i][1]}])
        alone = render([{"role": "user", "content": _MARK}])
        head = alone.split(_MARK)[0]
        default_system = head[:-len(prefix["user"])] if head.endswith(prefix["user"]) else ""
        content = None
        if default_system.startswith(prefix["system"]) and default_system.endswith(
                suffix["system"]) and len(default_system) > len(prefix["system"]):
            content = default_system[len(prefix["system"]):len(default_system)
                                     - len(suffix["system"])]
        return cls(prefix, suffix, default_system, content)

    def begin(self, role: str) -> str:
        if role not in self.prefix:
            raise ValueError(f"role must be one of {', '.join(ROLES)}, got {role!r}")
        return self.prefix[role]

    def end(self, role: str) -> str:
        return self.suffix[role]


def _renderer(source: str, bos_token: str | None, eos_token: str | None):
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise ValueError(f"chat template: {message}")

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[loopcontrols])
    env.globals["raise_exception"] = raise_exception
    template = env.from_string(source)

    def render(messages: list[dict[str, Any]]) -> str:
        return template.render(messages=messages, add_generation_prompt=False,
                               bos_token=bos_token or "", eos_token=eos_token or "")
    return render
