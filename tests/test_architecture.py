"""The layering of ARCHITECTURE.md, checked on the source: each module imports only from its own folder or from the
layers below it, the model files import nothing else of the package, no import happens inside a function, and there
is no import loop."""

import ast
import re
from pathlib import Path

import pytest

import vaswani_mt

PACKAGE = Path(vaswani_mt.__file__).parent

# ARCHITECTURE.md, bottom to top: a module may import its own folder and any layer with a lower rank.
RANKS = {"model": 0, "files": 1, "typed": 1, "precision": 1,
         "run_record": 2, "data": 3, "metrics": 3, "recipe": 4, "inference": 5,
         "publishing": 6, "package": 7, "": 8, "cli": 9}  # package.py: the public API; "": __init__.py, which loads it
# Imports inside a function by design: the package's __init__ serves its public names from package.py (torch,
# transformers) when one is first asked for (PEP 562), which under the `vaswani-mt` command it has not imported yet.
LAZY_IMPORTS = {("vaswani_mt", "vaswani_mt.package")}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


MODULES = {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def package_imports(module: str) -> list[tuple[str, int, bool]]:
    """(imported vaswani_mt module, line, inside a function) for each import of the package in `module`."""
    path = MODULES[module]
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []

    def visit(node, in_function):
        for child in ast.iter_child_nodes(node):
            inner = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            names = []
            if isinstance(child, ast.Import):
                names = [alias.name for alias in child.names]
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = package.split(".")[: len(package.split(".")) - child.level + 1]
                    prefix = ".".join(base + ([child.module] if child.module else []))
                else:
                    prefix = child.module or ""
                # `from .x import y` imports module x.y when y is a module, else module x
                names = [f"{prefix}.{alias.name}" if f"{prefix}.{alias.name}" in MODULES else prefix
                         for alias in child.names]
            for name in names:
                if name == "vaswani_mt" or name.startswith("vaswani_mt."):
                    found.append((name, child.lineno, in_function))
            visit(child, inner)

    visit(tree, False)
    return found


@pytest.mark.parametrize("module", sorted(MODULES))
def test_a_module_imports_only_its_own_folder_and_the_layers_below(module):
    here = layer(module)
    for imported, line, _ in package_imports(module):
        there = layer(imported)
        if imported == module or (there == here and here not in ("", "files", "typed", "run_record")):
            continue
        assert RANKS[there] < RANKS[here], (
            f"{MODULES[module].relative_to(PACKAGE.parent)}:{line} imports {imported}: layer {here or 'package'!r} "
            f"may not import layer {there or 'package'!r} (ARCHITECTURE.md)")


def test_the_model_files_that_travel_with_checkpoints_import_nothing_else_of_the_package():
    for module in MODULES:
        if layer(module) == "model":
            outside = [name for name, _, _ in package_imports(module) if layer(name) != "model"]
            assert not outside, f"{module} imports {outside}: a saved checkpoint could not load it"


def test_no_import_of_the_package_is_hidden_inside_a_function():
    hidden = [f"{MODULES[module].relative_to(PACKAGE.parent)}:{line} imports {name}"
              for module in MODULES for name, line, in_function in package_imports(module)
              if in_function and (module, name) not in LAZY_IMPORTS]
    assert not hidden, "\n".join(hidden)


def test_there_is_no_import_loop():
    graph = {module: {name for name, _, _ in package_imports(module) if name in MODULES and name != module}
             for module in MODULES}
    # a package's __init__ is imported before its modules: only its own imports count, not an edge back to it
    state: dict[str, int] = {}

    def visit(module, path):
        state[module] = 1
        for imported in graph[module]:
            if imported in path and imported == module:
                continue
            if state.get(imported) == 1 and not module.startswith(imported + "."):
                raise AssertionError("import loop: " + " -> ".join(path[path.index(imported):] + [imported]))
            if imported not in state:
                visit(imported, path + [imported])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])


def test_the_layers_the_test_knows_are_the_packages_folders():
    folders = {path.name for path in PACKAGE.iterdir() if (path / "__init__.py").is_file()}
    leaves = {path.stem for path in PACKAGE.glob("*.py") if path.name != "__init__.py"}
    assert folders | leaves == set(RANKS) - {""}


def architecture_rows() -> dict[str, str]:
    """ARCHITECTURE.md's table of layers: each name in a row's first cell (`data/`, `files.py`) -> the row."""
    rows = {}
    for line in (PACKAGE.parent / "ARCHITECTURE.md").read_text(encoding="utf-8").splitlines():
        if line.startswith("| `"):
            for name in re.findall(r"`([^`]+)`", line.split("|")[1]):
                rows[name] = line
    return rows


def test_every_module_of_the_package_is_named_in_its_layers_row_of_architecture_md():
    rows, missing = architecture_rows(), []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE).parts
        if len(parts) == 1:
            named, row = parts[0], rows.get(parts[0], "")
        elif parts[1] != "__init__.py":  # a module of a layer's folder, or a folder inside it (metrics' evaluate module)
            named, row = parts[1] if len(parts) == 2 else f"{parts[1]}/", rows.get(f"{parts[0]}/", "")
        else:
            continue
        if f"`{named}`" not in row:
            missing.append(str(path.relative_to(PACKAGE.parent)))
    assert not missing, f"modules ARCHITECTURE.md's table of layers does not name in their layer's row: {missing}"


SAVED_CODE = {"vaswani_mt.model.configuration_vaswani", "vaswani_mt.model.modeling_vaswani",
              "vaswani_mt.model.pipeline_vaswani"}  # copied beside every saved model (ARCHITECTURE.md)


def test_the_code_saved_beside_models_imports_only_itself_and_overrides_no_private_generation_method():
    from transformers.generation.utils import GenerationMixin

    for module in SAVED_CODE:
        others = {name for name, _, _ in package_imports(module)} - SAVED_CODE
        assert not others, f"{module} imports {others}: a saved folder would carry or miss them"
        tree = ast.parse(MODULES[module].read_text(encoding="utf-8"))
        private = [f"{cls.name}.{item.name}" for cls in ast.walk(tree) if isinstance(cls, ast.ClassDef)
                   for item in cls.body if isinstance(item, ast.FunctionDef) and item.name.startswith("_")
                   and not item.name.startswith("__") and hasattr(GenerationMixin, item.name)]
        assert not private, f"{module} overrides transformers' private {private}: saved code must not"
