"""The layers the code map promises, checked on the source: no import cycle between the engine's modules, and no
import upward through core -> ouro -> experiments -> runtime -> cli -> dashboard. Imports are read with ast, so an
import inside a function counts as much as one at the top of a file (it runs as soon as that function does); only
an import under `if TYPE_CHECKING:` (for annotations, never run) does not count."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("engine", "dashboard")
# the rank of each layer, lowest first: a module may import its own layer and those below it, never one above
LAYERS = {
    "core": 0,  # engine.core, and engine.paper / engine.errors / engine.studies (they import nothing of the engine)
    "ouro": 1,  # engine.ouro: the released model as an HF-style package (modeling, loading), never its experiments
    "experiments": 2,  # engine.experiments, E1 on the released model included
    "runtime": 3,  # engine.runtime, and engine.inputs (the checks of untrusted input the runtime and the CLI share)
    "cli": 4,  # engine.cli and engine.__main__
    "dashboard": 5,
}


def layer(module: str) -> str:
    parts = module.split(".")
    if parts[0] == "dashboard":
        return "dashboard"
    second = parts[1] if len(parts) > 1 else ""
    if second in ("core", "paper", "errors", "studies", ""):
        return "core"
    if second == "ouro":
        return "ouro"
    if second == "experiments":
        return "experiments"
    if second in ("runtime", "inputs"):
        return "runtime"
    if second in ("cli", "__main__"):
        return "cli"
    raise AssertionError(f"{module}: in no layer; add it to tests/test_layers.py's layer()")


def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = path
    return found


def run_time_nodes(tree: ast.AST):
    """Every node of the tree but those under `if TYPE_CHECKING:` (imports for annotations, never run)."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            test = getattr(child, "test", None) if isinstance(child, ast.If) else None
            if test is not None and ast.unparse(test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
                stack.extend(child.orelse)
                continue
            stack.append(child)


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The project modules `name` imports, anywhere in its file: `from a.b import c` names a.b.c where that is a
    module, else a.b; relative imports resolved against the module's package."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in run_time_nodes(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:  # `import engine.core.stats as s` or a name inside a module
                target = target.rpartition(".")[0]
            if target and target != name:
                out.add(target)
    return out


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports(name, path, known) for name, path in known.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = []
            while True:
                w = stack.pop()
                on.discard(w)
                part.append(w)
                if w == v:
                    break
            if len(part) > 1:
                out.append(sorted(part))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_every_module_has_a_layer():
    for name in graph():
        assert layer(name) in LAYERS


def test_no_import_cycle_between_engine_modules():
    edges = graph()
    engine = {m: {t for t in ts if t.startswith("engine")} for m, ts in edges.items() if m.startswith("engine")}
    # a package's __init__ that lists its own modules is not a cycle of code: leave out package -> own module
    engine = {m: {t for t in ts if not t.startswith(m + ".")} for m, ts in engine.items()}
    found = cycles(engine)
    assert not found, "import cycles: " + "; ".join(" <-> ".join(c) for c in found)


def test_no_cycle_between_the_dashboard_and_the_engine():
    found = [c for c in cycles(graph()) if any(m.startswith("dashboard") for m in c)]
    assert not found, "import cycles: " + "; ".join(" <-> ".join(c) for c in found)


def test_no_import_upward():
    upward = [
        f"{m} ({layer(m)}) imports {t} ({layer(t)})"
        for m, ts in sorted(graph().items())
        for t in sorted(ts)
        if LAYERS[layer(t)] > LAYERS[layer(m)]
    ]
    assert not upward, "imports upward:\n" + "\n".join(upward)


def test_the_dashboard_takes_nothing_from_the_cli():
    """What the dashboard shares with the CLI (the checks of a form's input) lives below both (engine.inputs)."""
    found = [f"{m} imports {t}" for m, ts in sorted(graph().items()) if m.startswith("dashboard")
             for t in sorted(ts) if layer(t) == "cli"]  # fmt: skip
    assert not found, "\n".join(found)


def test_the_checks_see_a_cycle_and_an_upward_import():
    """The checks themselves: a made-up cycle is found, and the layers rank as the code map says."""
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    ranks = [LAYERS[layer(m)] for m in ("engine.core.model", "engine.ouro.modeling", "engine.experiments.e1",
                                        "engine.runtime.jobs", "engine.cli", "dashboard.app")]  # fmt: skip
    assert ranks == sorted(ranks) and len(set(ranks)) == 6


def test_the_ouro_package_holds_the_model_and_nothing_that_uses_it():
    """engine/ouro is a model package in the style of transformers' models/<name>/: its modules import the core and
    nothing else of the project (not E1, its probe, the demo or the bench, which are experiments)."""
    edges = graph()
    ouro = {m for m in edges if m.startswith("engine.ouro")}
    assert ouro >= {"engine.ouro", "engine.ouro.modeling", "engine.ouro.hub"}
    found = [f"{m} imports {t}" for m in sorted(ouro) for t in sorted(edges[m]) if layer(t) not in ("core", "ouro")]
    assert not found, "\n".join(found)
    assert not {m for m in ouro if m.rpartition(".")[2] in ("e1", "probe", "demo", "measure", "bench")}
