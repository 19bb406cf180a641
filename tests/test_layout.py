"""The package's layout: no module imports one that imports it back, directly or through others."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "keras_transformer"


def module_name(path):
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path, modules):
    """The package's modules that `path` imports, at its top or inside a function alike."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # `from keras_transformer.runs import classification` imports the module
            # keras_transformer.runs.classification when there is one.
            names = [f"{node.module}.{alias.name}" for alias in node.names] + [node.module]
            names = [name for name in names[:-1] if name in modules] or [node.module]
        else:
            continue
        found.update(name for name in names if name in modules)
    return found


def import_graph():
    paths = {module_name(path): path for path in PACKAGE.rglob("*.py")}
    return {name: imports_of(path, paths) - {name} for name, path in paths.items()}


def cycles(graph):
    """Each import circle once, as a list of modules."""
    found, state = [], {}

    def visit(node, stack):
        state[node] = "open"
        stack.append(node)
        for target in sorted(graph[node]):
            if state.get(target) == "open":
                found.append(stack[stack.index(target):] + [target])
            elif target not in state:
                visit(target, stack)
        stack.pop()
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [])
    return found


def test_no_module_imports_one_that_imports_it_back():
    graph = import_graph()
    assert len(graph) > 40 and "keras_transformer.layers.attention" in graph
    # Packages import their own modules to re-export them; a module importing its
    # package's __init__ back would be a circle too, and is caught.
    assert cycles(graph) == [], "\n".join(" -> ".join(cycle) for cycle in cycles(graph))
