"""The Python layer's shape: no import cycles between stoker's modules, counting the imports
made inside functions (a cycle broken only by importing late is still a cycle), but not those
under `if TYPE_CHECKING:`, which never run; and the package's layers, each importing only from
its own subpackage and the layers below it (docs/ARCHITECTURE.md)."""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "python" / "stoker"


def module_name(path: Path) -> str:
    parts = ["stoker", *path.relative_to(PACKAGE).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> set[str]:
    """The stoker modules a file imports, with relative imports resolved."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text())
    skipped = {
        id(node)
        for guard in ast.walk(tree)
        if isinstance(guard, ast.If) and "TYPE_CHECKING" in ast.unparse(guard.test)
        for statement in guard.body
        for node in ast.walk(statement)
    }
    found = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("stoker")}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if not target.startswith("stoker"):
                continue
            if node.module is None:  # from . import x: the module x
                found |= {f"{target}.{a.name}" for a in node.names}
            else:
                found.add(target)
    return found - {name}


def import_graph() -> dict[str, set[str]]:
    files = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    return {name: imports_of(path) & set(files) for name, path in files.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    found, state = [], {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = "open"
        for target in sorted(graph[node]):
            if state.get(target) == "open":
                found.append(path[path.index(target) :] + [target])
            elif target not in state:
                visit(target, [*path, target])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    return found


def test_the_checker_finds_a_cycle():
    graph = {"stoker.a": {"stoker.b"}, "stoker.b": {"stoker.c"}, "stoker.c": {"stoker.a"}}
    assert cycles(graph) == [["stoker.a", "stoker.b", "stoker.c", "stoker.a"]]
    assert cycles({"stoker.a": {"stoker.b"}, "stoker.b": set()}) == []


def test_no_import_cycles_between_stokers_modules():
    graph = import_graph()
    assert "stoker.doctor.diagnosis" in graph and "stoker.load.loader" in graph
    # Submodules of a package import each other; the package's __init__ imports them. A module
    # importing its own package's __init__ would close a cycle through it: none does.
    assert cycles(graph) == []


# Each subpackage (or base module) and the layer it sits on: a module imports only its own
# subpackage's modules and those of lower layers. stoker/__init__.py and __main__ are the top.
LAYERS = {
    "stoker._core": 0, "stoker._media": 0, "stoker.errors": 0, "stoker.machine": 0,
    "stoker.loader_protocol": 0, "stoker.faults": 0, "stoker.ray_session": 0,
    "stoker.augment": 1, "stoker.remote": 1, "stoker.packing": 1, "stoker.device": 1,
    "stoker.parquet": 2,
    "stoker.load": 3,
    "stoker.doctor": 4, "stoker.integrations": 4,
    "stoker.tools": 5,
    "stoker": 6, "stoker.__main__": 6,
}  # fmt: skip


def layer_of(module: str) -> str:
    """The subpackage or base module `module` belongs to (its LAYERS key)."""
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in LAYERS:
            return ".".join(parts[:n])
    raise AssertionError(f"{module} is in no layer: add its subpackage to LAYERS")


def test_each_module_imports_only_its_own_subpackage_and_the_layers_below():
    wrong = []
    for module, imports in import_graph().items():
        mine = layer_of(module)
        for target in imports:
            theirs = layer_of(target)
            if theirs != mine and LAYERS[theirs] >= LAYERS[mine]:
                wrong.append(f"{module} imports {target} ({theirs}, layer {LAYERS[theirs]})")
    assert wrong == []


def test_the_layering_check_finds_a_wrong_way_import(monkeypatch):
    import test_architecture as me

    graph = {"stoker.device.feed": {"stoker.load.loader"}, "stoker.load.loader": set()}
    monkeypatch.setattr(me, "import_graph", lambda: graph)
    with pytest.raises(AssertionError, match="stoker.device.feed imports stoker.load.loader"):
        me.test_each_module_imports_only_its_own_subpackage_and_the_layers_below()


def test_no_module_is_over_700_lines_and_the_loaders_constructor_is_short():
    lines = {p.name: len(p.read_text().splitlines()) for p in PACKAGE.rglob("*.py")}
    assert {name: n for name, n in lines.items() if n > 700} == {}
    source = (PACKAGE / "load" / "loader.py").read_text()
    tree = ast.parse(source)
    (loader,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Loader"]
    (init,) = [n for n in loader.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"]
    assert init.end_lineno - init.lineno + 1 < 80


def test_the_doctor_is_split_by_concern_and_the_loader_needs_no_benchmark():
    graph = import_graph()
    assert not any(m.startswith("stoker.tools") for m in graph["stoker.load.loader"])
    assert not (
        graph["stoker.doctor.result"] & {"stoker.doctor.diagnosis", "stoker.doctor.watching"}
    )
    assert graph["stoker.machine"] == set()
