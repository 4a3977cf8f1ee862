"""The import layers of ``docs/design.md`` (*Layers*): the arrows that must not exist."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "stream_dp"


def _imports(path: Path) -> set[str]:
    """Every module ``path`` imports (at any depth: a lazy import is still an arrow)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
            out.update(f"{node.module}.{alias.name}" for alias in node.names)
    return out


FORBIDDEN = [
    # (modules under, may not import) — why: docs/design.md, *Layers*.
    ("privacy", ("stream_dp.online", "stream_dp.offline", "stream_dp.engine", "stream_dp.apps")),
    ("offline", ("stream_dp.online", "stream_dp.engine", "stream_dp.apps")),
    (
        "online",
        ("stream_dp.offline", "stream_dp.engine", "stream_dp.apps", "stream_dp.preprocessing"),
    ),
    ("engine", ("stream_dp.apps",)),
]


#: The floor: the mathematics every algorithm shares imports no algorithm and no application.
FLOOR = ("losses", "constraints", "linalg", "_jit", "sensitivity", "records", "huai", "metrics")
#: The privacy layer stands on the floor beside the mathematics: of the library it imports only
#: the numba switch (and, from ``connectors``, the record-error type).
FORBIDDEN.append(
    ("privacy", tuple(f"stream_dp.{m}" for m in FLOOR if m != "_jit")
                + ("stream_dp.preprocessing", "stream_dp.buffers", "stream_dp.regret",
                   "stream_dp.checkpoint", "stream_dp.datasets"))
)  # fmt: skip
FORBIDDEN.append(
    ("floor", ("stream_dp.online", "stream_dp.offline", "stream_dp.engine", "stream_dp.apps",
               "stream_dp.privacy"))
)  # fmt: skip


@pytest.mark.parametrize(("layer", "banned"), FORBIDDEN, ids=[f[0] for f in FORBIDDEN])
def test_no_arrow_against_the_layers(layer: str, banned: tuple[str, ...]) -> None:
    if layer == "floor":
        files = [PACKAGE / f"{name}.py" for name in FLOOR]
    else:
        files = sorted((PACKAGE / layer).rglob("*.py"))
    assert files
    bad = [
        f"{path.relative_to(PACKAGE)} imports {name}"
        for path in files
        for name in sorted(_imports(path))
        if any(name == b or name.startswith(b + ".") for b in banned)
    ]
    assert not bad, bad


def test_the_check_sees_lazy_imports(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text("def f():\n    from stream_dp.online import OnPairStrC\n")
    assert "stream_dp.online" in _imports(probe)


def test_the_fast_path_and_the_learner_core_name_no_mechanism() -> None:
    """``online/fast.py`` and ``online/base.py`` reach mechanisms only through the protocol of
    ``online/mechanism.py`` (``docs/design.md``, *Adding a mechanism*)."""
    concrete = ("stream_dp.online.output_perturbation", "stream_dp.online.correlated")
    for name in ("fast", "base"):
        imports = _imports(PACKAGE / "online" / f"{name}.py")
        assert not [m for m in imports if m.startswith(concrete)], name


def _module(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@pytest.mark.parametrize("layer", ["online", "privacy", "preprocessing", "offline"])
def test_no_import_circle_through_the_layer(layer: str) -> None:
    """No module of the layer can reach itself through imports (lazy ones included), within the
    package."""
    modules = {_module(p): p for p in PACKAGE.rglob("*.py")}
    graph = {m: {n for n in _imports(p) if n in modules and n != m} for m, p in modules.items()}
    for start in (m for m in modules if m.startswith(f"stream_dp.{layer}")):
        seen, todo = set(), list(graph[start])
        while todo:
            m = todo.pop()
            assert m != start, f"{start} imports itself back"
            if m not in seen:
                seen.add(m)
                todo.extend(graph[m])
