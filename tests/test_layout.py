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


# DESIGN.md's dependency rules: which of the package's packages each may import.
STANDARD_LIBRARY = frozenset(__import__("sys").stdlib_module_names)


def imported_names(path):
    """`[(module name, at the top of the module)]` of every import in `path` (relative imports resolved)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    top_level = {id(node) for node in tree.body}
    package = module_name(path).rsplit(".", 1)[0] if path.name != "__init__.py" else module_name(path)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, id(node) in top_level) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            name = node.module or ""
            if node.level:
                name = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([name] if name else []))
            found.append((name, id(node) in top_level))
    return found


def test_layers_and_models_know_no_runtime():
    """`layers/` and `models/` import keras, numpy and each other only; TensorFlow's public API only inside a
    function (a fast path behind a backend check); and they name no export target nor a search's beams."""
    problems = []
    for path in sorted([*PACKAGE.glob("layers/*.py"), *PACKAGE.glob("models/*.py")]):
        for name, at_top in imported_names(path):
            root = name.split(".")[0]
            allowed = (root in ("keras", "numpy") or root in STANDARD_LIBRARY
                       or name.startswith(("keras_transformer.layers", "keras_transformer.models"))
                       or (name == "tensorflow" and not at_top))
            if not allowed:
                problems.append(f"{path.relative_to(PACKAGE)} imports {name}{' at its top' if at_top else ''}")
        text = path.read_text(encoding="utf-8").lower()
        problems += [f"{path.relative_to(PACKAGE)} names {word}" for word in ("litert", "tflite", "rows_per_source")
                     if word in text]
    assert problems == [], "\n".join(problems)


def test_no_private_tensorflow_module_and_each_package_below_the_ones_it_may_import():
    """No module imports TensorFlow's private modules; DESIGN.md's rules between the package's own packages."""
    rules = {  # a package: the packages of ours it must not import
        "text": ("models", "export", "runs", "training", "inference"),
        "data": ("models", "export", "runs"),
        "inference": ("training", "export", "runs"),
        "training": ("export", "runs"),
        "export": ("runs",),
    }
    problems = []
    for path in sorted(PACKAGE.rglob("*.py")):
        own = module_name(path).split(".")
        for name, _ in imported_names(path):
            if name.startswith(("tensorflow.python", "tensorflow.compiler", "tensorflow.core")):
                problems.append(f"{'.'.join(own)} imports TensorFlow's private {name}")
            parts = name.split(".")
            if len(own) > 1 and parts[0] == "keras_transformer" and len(parts) > 1:
                if parts[1] in rules.get(own[1], ()):
                    problems.append(f"{'.'.join(own)} imports {name}")
                if own[1] == "runs" and parts[1] == "runs" and len(parts) > 2 and len(own) > 2:
                    tasks = ("translation", "classification", "pretraining", "language_model")
                    if own[2] in tasks and parts[2] in tasks and parts[2] != own[2]:
                        problems.append(f"the task module {'.'.join(own)} imports another task's, {name}")
    assert problems == [], "\n".join(problems)


def code_lines(function):
    """A function's lines, its docstring left out."""
    first = function.body[0]
    docstring = isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str)
    return function.end_lineno - function.lineno + 1 - ((first.end_lineno - first.lineno + 1) if docstring else 0)


def test_every_function_reads_at_once_and_every_module_is_of_a_readable_size():
    too_long = []
    for path in sorted(PACKAGE.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        if len(text.splitlines()) > 530:  # about 500
            too_long.append(f"{path.relative_to(PACKAGE)}: {len(text.splitlines())} lines")
        too_long += [f"{path.relative_to(PACKAGE)}: {node.name} has {code_lines(node)} lines"
                     for node in ast.walk(ast.parse(text))
                     if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and code_lines(node) > 60]
    assert too_long == [], "\n".join(too_long)
