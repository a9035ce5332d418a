"""The Python layer's shape: no import cycles between stoker's modules, counting the imports
made inside functions (a cycle broken only by importing late is still a cycle), but not those
under `if TYPE_CHECKING:`, which never run."""

import ast
from pathlib import Path

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
    assert "stoker.doctor.diagnosis" in graph and "stoker.loader" in graph
    # Submodules of a package import each other; the package's __init__ imports them. A module
    # importing its own package's __init__ would close a cycle through it: none does.
    assert cycles(graph) == []


def test_the_doctor_is_split_by_concern_and_the_loader_needs_no_benchmark():
    graph = import_graph()
    assert not any(m.startswith("stoker.bench") for m in graph["stoker.loader"])
    assert not (
        graph["stoker.doctor.result"] & {"stoker.doctor.diagnosis", "stoker.doctor.watching"}
    )
    assert graph["stoker.machine"] == set()
