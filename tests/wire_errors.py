"""What names a wire error, and where a module imports one, read from the source with ``ast``:
the reader of ``tests/test_interfaces.py``'s rule that the engine imports no wire errors."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from .import_graph import dotted, imported_from, package_dirs, package_of, within

PROTOCOL = "wschat.protocol"
PROTOCOL_ERRORS = f"{PROTOCOL}.errors"


def wire_error_names() -> frozenset[str]:
    """Every name ``protocol/errors.py`` defines at its top level, with ``ErrorCode`` and the
    ``Error`` frame: what names a wire error code."""
    tree = ast.parse(package_dirs()[PROTOCOL].joinpath("errors.py").read_text())
    defined = {
        node.name
        for node in tree.body
        if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
    }
    defined |= {
        target.id
        for node in tree.body
        if isinstance(node, ast.Assign)
        for target in node.targets
        if isinstance(target, ast.Name)
    }
    return frozenset(defined | {"ErrorCode", "Error"})


def is_wire_error(name: str, wire_names: frozenset[str]) -> bool:
    """Whether the dotted ``name`` (a module, or a module's attribute) is a wire error."""
    module, _, attribute = name.rpartition(".")
    return within(name, PROTOCOL_ERRORS) or (within(module, PROTOCOL) and attribute in wire_names)


def wire_errors_in(
    module: str, path: Path, known: set[str], wire_names: frozenset[str]
) -> Iterator[str]:
    """The wire errors ``module`` imports, by name (``from wschat.protocol import TooLarge``)
    or as an attribute of a protocol module it imported (``protocol.ErrorCode``)."""
    tree = ast.parse(path.read_text(), str(path))
    package = package_of(module, path)
    bound: dict[str, str] = {}  # a local name -> the module it is bound to
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    bound[alias.asname] = alias.name
                else:
                    first = alias.name.split(".")[0]
                    bound[first] = first
                if is_wire_error(alias.name, wire_names):
                    yield alias.name
        elif isinstance(node, ast.ImportFrom):
            base = imported_from(package, node)
            for alias in node.names:
                name = f"{base}.{alias.name}"
                if name in known or within(name, PROTOCOL_ERRORS):
                    bound[alias.asname or alias.name] = name
                if is_wire_error(name, wire_names):
                    yield name
    for node in ast.walk(tree):
        chain = dotted(node) if isinstance(node, ast.Attribute) else None
        if chain is None:
            continue
        first, _, rest = chain.partition(".")
        name = f"{bound[first]}.{rest}" if first in bound else ""
        if name and is_wire_error(name, wire_names):
            yield name
