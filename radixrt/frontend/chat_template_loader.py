"""`--chat-template PATH|NAME|TEXT`: the Jinja chat template that replaces the tokenizer's.

Read as vLLM reads its --chat-template, with radixrt's shipped templates as its built-in
ones: a file's path; else the name of a template shipped in radixrt/frontend/chat_templates/
(with or without ".jinja"); else, when the text has a Jinja character ("{", "}" or a
newline), the template itself, as given. Anything else is a ValueError naming the flag and
the shipped names. Stdlib only: ServerArgs checks the flag with this before anything loads.
"""

from __future__ import annotations

from pathlib import Path

SHIPPED_DIR = Path(__file__).parent / "chat_templates"
_JINJA_CHARS = "{}\n"  # vLLM's test for "this is a template, not a path"


def shipped_names() -> list[str]:
    """The names of the templates shipped with radixrt, sorted."""
    return sorted(p.stem for p in SHIPPED_DIR.glob("*.jinja"))


def load_chat_template(value: str) -> str:
    """The template's text for a --chat-template value (see the module's docstring)."""
    path = Path(value).expanduser()
    if _is_file(path):
        return _read(path, value)
    shipped = SHIPPED_DIR / (value if value.endswith(".jinja") else f"{value}.jinja")
    if "/" not in value and _is_file(shipped):
        return _read(shipped, value)
    if any(c in value for c in _JINJA_CHARS):
        return value
    raise ValueError(
        f"chat_template (--chat-template) {value!r} is neither a file nor a template "
        f"shipped with radixrt ({', '.join(shipped_names())}), nor Jinja text"
    )


def _is_file(path: Path) -> bool:
    try:
        return path.is_file()
    except (OSError, ValueError):  # inline text: a name too long for a path, a NUL in it
        return False


def _read(path: Path, value: str) -> str:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"chat_template (--chat-template) {value!r} cannot be read: {e}") from None
    if not text.strip():
        raise ValueError(f"chat_template (--chat-template) {value!r} is an empty file")
    return text
