"""The layer order of docs/architecture.md, held: no module imports from a layer above its own.

Every import counts, module-level or lazy (inside a function), type-only or not: a lazy import
is still a dependency, and the cycles this test broke were all lazy ones. Modules of one layer
may import each other. The order is written once here and once in docs/architecture.md.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Low to high; the names of one tuple are one layer. A top-level module or package of
# radixrt/ (lang/ and kernels/ install as radixrt.lang and radixrt.kernels).
LAYERS: tuple[tuple[str, ...], ...] = (
    ("server_args", "errors", "observability"),
    ("native", "kernels", "distributed"),
    ("grammar",),
    ("protocol",),
    ("cache", "ipc", "disaggregation"),
    ("attention",),
    ("layers",),
    ("models",),
    ("loader", "executor", "speculative"),
    ("scheduler", "detokenizer"),
    ("frontend",),
    ("lang",),
    ("entrypoints",),
    ("cli",),
)
LEVEL = {name: level for level, names in enumerate(LAYERS) for name in names}

# (importer, imported) pairs allowed against the order, each with its reason. Keep it short.
ALLOWED: dict[tuple[str, str], str] = {
    ("server_args", "frontend"): (
        "server_args/checks.py checks --chat-template with the frontend's loader (stdlib "
        "only), so a bad value fails at the flags, before anything loads"
    ),
}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[0] != "radixrt":  # lang/, kernels/
        parts.insert(0, "radixrt")
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imported(tree: ast.AST, module: str, is_package: bool) -> set[str]:
    """Every radixrt module `module` imports, relative imports resolved."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = module.split(".")
            if node.level:
                base = base[: len(base) - node.level + is_package]
                target = ".".join(base + [node.module] if node.module else base)
            else:
                target = node.module or ""
            found.add(target)
            found.update(f"{target}.{a.name}" for a in node.names)  # `from pkg import mod`
    return {name for name in found if name.startswith("radixrt.")}


def _layer_of(module: str) -> str | None:
    """The layer name of radixrt.<top>...; None for a name that is no layer (an attribute)."""
    top = module.split(".")[1]
    return top if top in LEVEL else None


def _sources() -> list[Path]:
    files = [*(ROOT / "radixrt").rglob("*.py"), *(ROOT / "lang").rglob("*.py")]
    files += (ROOT / "kernels").rglob("*.py")
    return sorted(files)


def violations() -> list[str]:
    """One line per importing module and layer above it, naming the first such import."""
    found: dict[tuple[str, str], str] = {}
    for path in _sources():
        module = _module_name(path)
        if module == "radixrt":  # the package's facade loads its public names lazily
            continue
        own = _layer_of(module)
        assert own is not None, f"{module} is in no layer: add its folder to LAYERS"
        tree = ast.parse(path.read_text(), filename=str(path))
        for target in _imported(tree, module, path.name == "__init__.py"):
            layer = _layer_of(target)
            if layer is None or LEVEL[layer] <= LEVEL[own] or (own, layer) in ALLOWED:
                continue
            key = (module, layer)
            found[key] = min(found.get(key, target), target)
    return sorted(f"{m} imports {t} ({_layer_of(m)} < {layer})" for (m, layer), t in found.items())


def test_no_module_imports_from_a_layer_above_its_own() -> None:
    assert violations() == []


def test_every_top_level_module_and_package_has_a_layer() -> None:
    tops = {p.stem for p in (ROOT / "radixrt").glob("*.py") if p.stem != "__init__"}
    tops |= {p.name for p in (ROOT / "radixrt").iterdir() if (p / "__init__.py").exists()}
    assert tops | {"lang", "kernels"} == set(LEVEL)


def test_the_allowlist_is_used() -> None:
    """An entry that nothing needs any more goes, so the list only shrinks."""
    pairs = set()
    for path in _sources():
        module = _module_name(path)
        own = _layer_of(module) if module != "radixrt" else None
        tree = ast.parse(path.read_text())
        for target in _imported(tree, module, path.name == "__init__.py"):
            if own is not None and _layer_of(target) is not None:
                pairs.add((own, _layer_of(target)))
    assert set(ALLOWED) <= pairs


@pytest.mark.parametrize(
    "source, expected",
    [
        ("from radixrt.scheduler.req import Req", ["radixrt.cache.x imports"]),
        ("def f():\n    from radixrt.entrypoints import launch", ["radixrt.cache.x imports"]),
        ("from radixrt.errors import ParamError", []),
        ("from . import allocator", []),
    ],
)
def test_the_walk_sees_module_level_and_lazy_imports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, source: str, expected: list[str]
) -> None:
    """The walker itself can fail: a planted upward import (lazy or not) is reported."""
    fake = tmp_path / "radixrt" / "cache"
    fake.mkdir(parents=True)
    (fake / "x.py").write_text(source)
    monkeypatch.setattr(f"{__name__}.ROOT", tmp_path)
    monkeypatch.setattr(f"{__name__}._sources", lambda: [fake / "x.py"])
    assert [v[: len("radixrt.cache.x imports")] for v in violations()] == expected
