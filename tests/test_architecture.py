"""The packages' imports point one way (server -> recipes -> estimator), without cycles, and the core stays light.

Every module of ``estimator/``, ``recipes/`` and ``server/`` is parsed with ``ast`` (nothing is imported), and every
import is read, those inside functions included: a function-level import is still a dependency, only a later one.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("estimator", "recipes", "server")
# libraries the core must not import when it is imported (the estimator is pure Python, torch-free and offline)
HEAVY_OR_NETWORK = ("torch", "transformers", "peft", "trl", "bitsandbytes", "accelerate", "deepspeed", "vllm",
                    "datasets", "safetensors", "huggingface_hub", "requests", "httpx", "urllib3", "aiohttp",
                    "urllib.request", "http.client", "socket")


def _modules() -> dict[str, Path]:
    """canifinetune.<package>.<module> -> its file, for every module of the three packages."""
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = [package, *path.relative_to(ROOT / package).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(["canifinetune", *parts])] = path
    return found


MODULES = _modules()


def _is_package(module: str) -> bool:
    return MODULES[module].name == "__init__.py"


def _imports(module: str, *, module_level_only: bool = False, annotations: bool = False) -> set[str]:
    """Every name ``module`` imports, absolute (relative imports resolved; ``from pkg import sub`` gives pkg.sub);
    with ``annotations`` those under ``if TYPE_CHECKING:`` too."""
    tree = ast.parse(MODULES[module].read_text(encoding="utf-8"))
    nodes = _walk(tree, into_functions=not module_level_only, annotations=annotations)
    package = module if _is_package(module) else module.rpartition(".")[0]
    names: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package
                for _ in range(node.level - 1):
                    base = base.rpartition(".")[0]
                base = f"{base}.{node.module}" if node.module else base
            else:
                base = node.module or ""
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names if f"{base}.{alias.name}" in MODULES)
    return names


def _walk(tree: ast.Module, *, into_functions: bool, annotations: bool = False):
    """The nodes of ``tree`` but those under ``if TYPE_CHECKING:`` (annotations only; kept with ``annotations``);
    without ``into_functions`` only what runs when the module is imported (inside if/try/with/class at the top, not
    inside defs)."""
    stack: list[ast.AST] = list(tree.body)
    while stack:
        node = stack.pop()
        if not annotations and isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            stack.extend(node.orelse)
            continue
        yield node
        if not into_functions and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        stack.extend(ast.iter_child_nodes(node))


def _package_of(name: str) -> str | None:
    parts = name.split(".")
    if parts[0] == "canifinetune" and len(parts) > 1:
        return parts[1]
    if parts[0] in PACKAGES:  # `import estimator` from the checkout: a second copy of every class
        return parts[0]
    return None


def _internal(name: str) -> str | None:
    """The module of the three packages that ``name`` refers to (a module, or a name inside one)."""
    while name:
        if name in MODULES:
            return name
        name = name.rpartition(".")[0]
    return None


@pytest.mark.parametrize(("package", "forbidden"), [("estimator", {"recipes", "server"}), ("recipes", {"server"})])
def test_imports_point_one_way(package, forbidden):
    wrong = sorted(f"{module} imports {name}" for module in MODULES if module.split(".")[1] == package
                   for name in _imports(module) if _package_of(name) in forbidden)
    assert not wrong, "imports must point server -> recipes -> estimator:\n" + "\n".join(wrong)


def test_no_import_of_the_checkout_as_top_level_packages():
    bare = sorted(f"{module} imports {name}" for module in MODULES for name in _imports(module)
                  if name.split(".")[0] in PACKAGES)
    assert not bare, "import through canifinetune.<package>, never the checkout's folders:\n" + "\n".join(bare)


@pytest.mark.parametrize("package", PACKAGES)
def test_no_import_cycle_within_a_package(package):
    assert not _cycles(package, module_level_only=True), "a module-level cycle fails at import time"
    cycles = _cycles(package, module_level_only=False)
    assert not cycles, f"import cycles in {package} (function-level imports included):\n" + "\n".join(cycles)


@pytest.mark.parametrize("package", PACKAGES)
def test_no_cycle_through_annotation_imports(package):
    """Types lie flat: no two modules need each other's types, not even only for annotations (``if TYPE_CHECKING:``).
    A record both sides use lives on the floor below both (estimator/tensor_records.py, gpu_records.py, ...)."""
    cycles = _cycles(package, module_level_only=False, annotations=True)
    assert not cycles, f"cycles in {package} through TYPE_CHECKING imports:\n" + "\n".join(cycles)


def _cycles(package: str, *, module_level_only: bool, annotations: bool = False) -> list[str]:
    members = [m for m in MODULES if m.split(".")[1] == package]
    graph = {
        m: sorted(
            {
                t
                for name in _imports(m, module_level_only=module_level_only, annotations=annotations)
                if (t := _internal(name))
                and t != m
                and t.split(".")[1] == package
                and not (_is_package(t) and m.startswith(t + "."))
            }
        )
        for m in members
    }
    cycles = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for target in graph[module]:
            if state.get(target) == 1:
                cycles.append(" -> ".join([*path[path.index(target):], target]))
            elif target not in state:
                visit(target, [*path, target])
        state[module] = 2

    for module in members:
        if module not in state:
            visit(module, [module])
    return cycles


def test_estimator_imports_no_heavy_or_network_library_at_module_level():
    heavy = sorted(f"{module} imports {name}" for module in MODULES if module.split(".")[1] == "estimator"
                   for name in _imports(module, module_level_only=True)
                   if any(name == lib or name.startswith(lib + ".") for lib in HEAVY_OR_NETWORK))
    assert not heavy, "the core imports these when it is imported:\n" + "\n".join(heavy)


def test_the_modules_were_found():
    assert "canifinetune.estimator.estimate" in MODULES and "canifinetune.server.cli" in MODULES
    assert "canifinetune.estimator.configs" in MODULES  # subpackages too


def test_every_error_class_is_declared_in_the_one_error_module():
    """estimator/errors.py holds the one hierarchy (its docstring draws the tree); other modules re-export."""
    errors = MODULES["canifinetune.estimator.errors"]
    elsewhere = sorted(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}" for module, path in MODULES.items()
                       if path != errors for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
                       if isinstance(node, ast.ClassDef) and node.name.endswith(("Error", "Exception")))
    assert not elsewhere, "declare error classes in estimator/errors.py:\n" + "\n".join(elsewhere)
    declared = [
        node.name for node in ast.parse(errors.read_text(encoding="utf-8")).body if isinstance(node, ast.ClassDef)
    ]
    doc = ast.get_docstring(ast.parse(errors.read_text(encoding="utf-8"))) or ""
    assert all(f"── {name}" in doc for name in declared), "the module docstring's tree names every class"


MAX_FUNCTION_LINES = 80


def test_no_function_is_longer_than_a_screen():
    """Split where the logic divides (a phase, an engine, a knob, a family trait) rather than grow past a screen."""
    long = sorted(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
                  for path in MODULES.values() for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
                  if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES)
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines:\n" + "\n".join(long)
