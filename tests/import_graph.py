"""The modules of the repository and what each imports, read from the source with ``ast``: the
reader that ``tests/test_layering.py``, ``test_interfaces.py`` and ``private_names.py`` check
their rules on.

Every import statement counts, at module level or inside a function, so a lazy import cannot slip
past; one under ``if TYPE_CHECKING:`` is typing-only (it never runs).
"""

from __future__ import annotations

import ast
import tomllib
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# run from a checkout, not installed: their modules are named after their folders
CHECKOUT_PACKAGES = ("tests", "bench")

Edge = tuple[str, str]


def package_dirs() -> dict[str, Path]:
    """``wschat.protocol`` -> ``protocol/``, ...: the mapping the package is installed with."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    mapping = project["tool"]["setuptools"]["package-dir"]
    return {package: ROOT / folder for package, folder in mapping.items()}


def modules_under(package: str, folder: Path) -> dict[str, Path]:
    modules = {}
    for path in folder.rglob("*.py"):
        parts = path.relative_to(folder).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join((package, *parts))] = path
    return modules


def our_modules() -> dict[str, Path]:
    """The installed packages' modules: ``wschat.protocol.frames`` -> its file."""
    return {
        name: path
        for package, folder in package_dirs().items()
        for name, path in modules_under(package, folder).items()
    }


def source_modules() -> dict[str, Path]:
    """Every module of the repository: the packages', the tests' and the bench's."""
    modules = our_modules()
    for package in CHECKOUT_PACKAGES:
        modules |= modules_under(package, ROOT / package)
    return modules


def package_of(module: str, path: Path) -> str:
    """The package relative imports in ``module`` (the file ``path``) are read from."""
    return module if path.name == "__init__.py" else module.rpartition(".")[0]


def imported_from(package: str, node: ast.ImportFrom) -> str:
    """The absolute name of the module ``from ... import`` reads, from within ``package``."""
    base = node.module or ""
    if not node.level:
        return base
    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
    return ".".join([*anchor, base] if base else anchor)


def typing_only(tree: ast.Module) -> set[int]:
    """The ids of the nodes under an ``if TYPE_CHECKING:`` (never run)."""
    return {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and ast.unparse(node.test).endswith("TYPE_CHECKING")
        for statement in node.body
        for inner in ast.walk(statement)
    }


def imports_of(module: str, path: Path, known: set[str], *, typing: bool = True) -> Iterator[str]:
    """The absolute name of each module that ``module`` (the file ``path``) imports; with
    ``typing=False``, only the imports that run."""
    package = package_of(module, path)
    tree = ast.parse(path.read_text(), str(path))
    skipped = set() if typing else typing_only(tree)
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = imported_from(package, node)
            for alias in node.names:
                # ``from . import loader`` imports the submodule, not the package
                submodule = f"{base}.{alias.name}"
                yield submodule if submodule in known else base


def import_graph(modules: dict[str, Path] | None = None, *, typing: bool = True) -> set[Edge]:
    """(importer, imported) for each import in ``modules`` (the packages' by default)."""
    modules = our_modules() if modules is None else modules
    known = set(modules)
    return {
        (m, target)
        for m, path in modules.items()
        for target in imports_of(m, path, known, typing=typing)
    }


def within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def dotted(node: ast.expr) -> str | None:
    """``a.b.c`` for an attribute chain on a name, else None."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return ".".join([node.id, *reversed(parts)]) if isinstance(node, ast.Name) else None
