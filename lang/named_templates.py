"""SGLang's named chat templates (the plain-style ones), for `RuntimeEndpoint(url,
chat_template_name=...)` and for servers that give no jinja template (a real SGLang server):
then the template is picked from the model path, as SGLang's frontend does ("default" if
nothing matches). The role markers are those SGLang's templates of these names use.
"""

from __future__ import annotations

import re

from radixrt.lang.chat_template import ROLES, ChatTemplate

_IM = ("<|im_start|>{role}\n", "<|im_end|>\n")
_L3 = ("<|start_header_id|>{role}<|end_header_id|>\n\n", "<|eot_id|>")

# name -> ({role: (prefix, suffix)}, default system prompt, stop strings)
_TEMPLATES: dict[str, tuple[dict[str, tuple[str, str]], str | None, tuple[str, ...]]] = {
    "default": (
        {"system": ("SYSTEM:", "\n"), "user": ("USER:", "\n"), "assistant": ("ASSISTANT:", "\n")},
        None,
        (),
    ),
    "claude": (
        {"system": ("", ""), "user": ("\n\nHuman: ", ""), "assistant": ("\n\nAssistant:", "")},
        None,
        (),
    ),
    "chatml": ({r: (_IM[0].format(role=r), _IM[1]) for r in ROLES}, None, ("<|im_end|>",)),
    "qwen": (
        {r: (_IM[0].format(role=r), _IM[1]) for r in ROLES},
        "You are a helpful assistant.",
        ("<|im_end|>",),
    ),
    "llama-3-instruct": (
        {r: (_L3[0].format(role=r), _L3[1]) for r in ROLES},
        None,
        ("<|eot_id|>",),
    ),
    "vicuna_v1.1": (
        {"system": ("", " "), "user": ("USER:", " "), "assistant": ("ASSISTANT:", "</s>")},
        "A chat between a curious user and an artificial intelligence assistant. "
        "The assistant gives helpful, detailed, and polite answers to the user's "
        "questions.",
        (),
    ),
    "mistral": (
        {
            "system": ("[SYSTEM_PROMPT] ", " [/SYSTEM_PROMPT]"),
            "user": ("[INST] ", " [/INST]"),
            "assistant": ("", " </s><s>"),
        },
        None,
        ("</s>",),
    ),
    "gemma-it": (
        {
            "system": ("", ""),
            "user": ("<start_of_turn>user\n", "<end_of_turn>\n"),
            "assistant": ("<start_of_turn>model\n", "<end_of_turn>\n"),
        },
        None,
        (),
    ),
    "yi-1.5": (
        {
            "system": ("", ""),
            "user": ("<|im_start|>user\n", "<|im_end|>\n<|im_start|>assistant\n"),
            "assistant": ("", "<|im_end|>\n"),
        },
        None,
        ("<|im_end|>",),
    ),
    "deepseek-v3": (
        {
            "system": ("", ""),
            "user": ("<\uff5cUser\uff5c>", ""),
            "assistant": ("<\uff5cAssistant\uff5c>", "<\uff5cend\u2581of\u2581sentence\uff5c>"),
        },
        None,
        ("<\uff5cend\u2581of\u2581sentence\uff5c>",),
    ),
    "granite-3-instruct": (
        {r: (f"<|start_of_role|>{r}<|end_of_role|>", "<|end_of_text|>") for r in ROLES},
        None,
        ("<|end_of_text|>",),
    ),
}
NAMES = tuple(_TEMPLATES)

# (pattern, unless this also matches, template name): SGLang's matching for these names,
# case-insensitive, first match wins.
_MATCHES = [
    (r"deepseek-(v3|r1)", r"base", "deepseek-v3"),
    (r"orion", None, "claude"),
    (r"vicuna|llava-v1\.5|llava-next-video-7b", None, "vicuna_v1.1"),
    (r"pixtral|(mistral|mixtral).*instruct", None, "mistral"),
    (r"llama-3.*instruct", None, "llama-3-instruct"),
    (r"tinyllama", None, "chatml"),
    (r"qwen.*(chat|instruct)", r"llava|qwen.*vl", "qwen"),
    (r"yi-1\.5.*chat", None, "yi-1.5"),
    (r"(gemma.*it)|(gemma-3)", r"gemma-4", "gemma-it"),
    (r"granite.*instruct", None, "granite-3-instruct"),
]


def named_template(name: str) -> ChatTemplate:
    """SGLang's template of that name; ValueError naming the names radixrt knows."""
    if name not in _TEMPLATES:
        raise ValueError(f"chat_template_name must be one of {', '.join(NAMES)}; got {name!r}")
    roles, system_prompt, stop = _TEMPLATES[name]
    prefix = {r: roles[r][0] for r in ROLES}
    suffix = {r: roles[r][1] for r in ROLES}
    default_system = (
        "" if system_prompt is None else prefix["system"] + system_prompt + suffix["system"]
    )
    return ChatTemplate(prefix, suffix, default_system, system_prompt, stop, name)


def template_name_for(model_path: str | None) -> str:
    """The template SGLang's frontend picks for a model path ("default" if none matches)."""
    for pattern, unless, name in _MATCHES:
        if (
            model_path
            and re.search(pattern, model_path, re.IGNORECASE)
            and not (unless and re.search(unless, model_path, re.IGNORECASE))
        ):
            return name
    return "default"
