"""Where a module reads another module's private names, read from the source with ``ast``.

A name that starts with ``_`` (a dunder excepted) belongs to the module that defines it: what
another module needs of it is made public, or moved to the module that owns it. A module of ours
(``wschat``, ``tests``, ``bench``) reads another's private name when it

- imports it: ``from wschat.server.engine.formats import _without_end``;
- reads it on an imported module or one of its names: ``run._figures``, ``Engine._step``;
- reads it on an object the source says is of another module's class: a name annotated as that
  class or assigned a call of it (``reply: Reply`` ... ``reply._feed``), an attribute of
  ``self`` the class annotates so; or, where the object's class is unknown here, reads a name
  that no class of this module defines and a class of another module of ours does
  (``session._ids`` in a test).

Reads on ``self``, ``cls`` and ``super()`` are the class's own (a subclass's too). Third-party
private names are not ours to rule on: tests/install/test_dependency_bounds.py pins the
internals we use.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from .import_graph import dotted, imported_from, package_of, within

OURS = ("wschat", "tests", "bench")
# what a read on these names reaches is the reading class's own
OWN = "<own>"


def is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def is_ours(name: str) -> bool:
    return any(within(name, root) for root in OURS)


@dataclass(frozen=True)
class Reach:
    """``module`` reads ``read`` (as written, at ``line``), a private name of ``owners`` (more
    than one where the object's class is unknown and several modules define the name);
    ``imported``: by an import."""

    module: str
    line: int
    read: str
    owners: tuple[str, ...]
    imported: bool = False


class Index:
    """What every module of ours defines: its classes, the private names its classes define,
    and the names it re-exports (``wschat.client.Reply`` is ``wschat.client.reply.Reply``)."""

    def __init__(self, modules: dict[str, Path]) -> None:
        self.modules: set[str] = set()
        self.trees: dict[str, ast.Module] = {}
        self.packages: dict[str, str] = {}
        self.classes: set[str] = set()
        self.defines: dict[str, set[str]] = {}
        self.aliases: dict[str, str] = {}
        for module, path in modules.items():
            self.add(module, path)

    def add(self, module: str, path: Path) -> None:
        tree = ast.parse(path.read_text(), str(path))
        self.modules.add(module)
        self.trees[module], self.packages[module] = tree, package_of(module, path)
        self.classes |= {f"{module}.{n.name}" for n in tree.body if isinstance(n, ast.ClassDef)}
        self.defines[module] = class_private_names(tree)
        for node in tree.body:
            if isinstance(node, ast.ImportFrom):
                base = imported_from(self.packages[module], node)
                for alias in node.names:
                    self.aliases[f"{module}.{alias.asname or alias.name}"] = f"{base}.{alias.name}"

    def resolve(self, name: str) -> str:
        """``name`` with every re-export followed to where it is defined."""
        for _ in range(10):  # a re-export of a re-export, a few deep at most
            parts = name.split(".")
            for cut in range(len(parts), 1, -1):
                head = ".".join(parts[:cut])
                if head in self.aliases and head not in self.modules:
                    name = ".".join([self.aliases[head], *parts[cut:]])
                    break
            else:
                return name
        return name

    def owner(self, name: str) -> str | None:
        """The module of ours that defines ``name`` (a module, or a name in one), else None."""
        parts = self.resolve(name).split(".")
        for cut in range(len(parts), 0, -1):
            head = ".".join(parts[:cut])
            if head in self.modules:
                return head
        return None

    def definers(self, attribute: str) -> list[str]:
        return sorted(m for m, names in self.defines.items() if attribute in names)


def class_private_names(tree: ast.Module) -> set[str]:
    """The private names the module's classes define."""
    classes = (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef))
    return {name for cls in classes for name in class_names(cls) if is_private(name)}


def class_names(cls: ast.ClassDef) -> set[str]:
    """The names a class defines: methods, class attributes, and what its methods assign on
    ``self``."""
    names: set[str] = set()
    for statement in cls.body:
        if isinstance(statement, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(statement.name)
        targets = statement.targets if isinstance(statement, ast.Assign) else []
        if isinstance(statement, ast.AnnAssign):
            targets = [statement.target]
        names |= {t.id for t in targets if isinstance(t, ast.Name)}
    for node in ast.walk(cls):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.ctx, ast.Store)
            and isinstance(node.value, ast.Name)
            and node.value.id == "self"
        ):
            names.add(node.attr)
    return names


Scope = dict[str, str]  # a local name -> the dotted name of its module, or of its class


def imported_names(tree: ast.Module, package: str) -> Scope:
    """What each name an import binds stands for: ``import a.b`` binds ``a``; ``from a import
    b as c`` binds ``c`` to ``a.b``."""
    bound: Scope = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                local = alias.asname or alias.name.split(".")[0]
                bound[local] = alias.name if alias.asname else local
        elif isinstance(node, ast.ImportFrom):
            base = imported_from(package, node)
            for alias in node.names:
                bound[alias.asname or alias.name] = f"{base}.{alias.name}"
    return bound


def body_of(node: ast.AST) -> Iterator[ast.AST]:
    """The nodes of a scope, without those of the functions and classes defined in it."""
    for child in ast.iter_child_nodes(node):
        yield child
        if not isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            yield from body_of(child)


class Reader:
    """Walks one module, keeping what each name in scope is known to be."""

    def __init__(self, index: Index, module: str) -> None:
        self.index, self.module = index, module
        tree = index.trees[module]
        self.imported = imported_names(tree, index.packages[module])
        # the scopes the node being read is in, innermost last; what each types, once asked
        self.scopes: list[ast.Module | ast.FunctionDef | ast.AsyncFunctionDef] = [tree]
        self.types: dict[int, Scope] = {}
        self.fields: Scope = {}  # ``self.x`` -> its class, in the class being read
        self.found: list[Reach] = []
        self.visit(tree)

    def class_of(self, annotation: ast.expr | None) -> str | None:
        """The class of ours an annotation names (``X``, ``X | None``, ``"X"``), else None."""
        if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
            annotation = ast.parse(annotation.value, mode="eval").body
        if isinstance(annotation, ast.BinOp):
            return self.class_of(annotation.left) or self.class_of(annotation.right)
        chain = dotted(annotation) if isinstance(annotation, ast.expr) else None
        if chain is None:
            return None
        first, _, rest = chain.partition(".")
        if first in self.imported:
            name = self.index.resolve(".".join(filter(None, [self.imported[first], rest])))
        else:
            name = f"{self.module}.{chain}"  # a class of this module, or nothing of ours
        return name if name in self.index.classes else None

    def built(self, value: ast.expr | None) -> str | None:
        """The class of ours ``value`` is a call of (``Reply(...)``), else None."""
        return self.class_of(value.func) if isinstance(value, ast.Call) else None

    def typed(self, scope: ast.AST) -> Scope:
        """The names of ``scope`` (a function's arguments and assignments) known to hold an
        instance of a class: annotated as it, or assigned a call of it."""
        types: Scope = {}
        if isinstance(scope, ast.FunctionDef | ast.AsyncFunctionDef):
            arguments = scope.args
            for arg in [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]:
                if (cls := self.class_of(arg.annotation)) is not None:
                    types[arg.arg] = cls
        for node in body_of(scope):
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                cls = self.class_of(node.annotation) or self.built(node.value)
                if cls is not None:
                    types[node.target.id] = cls
            elif isinstance(node, ast.Assign) and (cls := self.built(node.value)) is not None:
                types |= {t.id: cls for t in node.targets if isinstance(t, ast.Name)}
        return types

    def fields_of(self, cls: ast.ClassDef) -> Scope:
        """``self.x`` -> its class, as the class body or its methods annotate or build it."""
        fields: Scope = {}
        for statement in cls.body:
            if not (
                isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name)
            ):
                continue
            if (annotated := self.class_of(statement.annotation)) is not None:
                fields[statement.target.id] = annotated
        for node in ast.walk(cls):
            target: ast.expr | None = node.target if isinstance(node, ast.AnnAssign) else None
            if isinstance(node, ast.Assign) and len(node.targets) == 1:
                target = node.targets[0]
            if not (isinstance(target, ast.Attribute) and dotted(target) == f"self.{target.attr}"):
                continue
            annotation = node.annotation if isinstance(node, ast.AnnAssign) else None
            value = node.value if isinstance(node, ast.Assign | ast.AnnAssign) else None
            if (found := self.class_of(annotation) or self.built(value)) is not None:
                fields[target.attr] = found
        return fields

    def receiver(self, node: ast.expr) -> str | None:
        """What ``node`` is known to be: OWN, a dotted name (a module, or a class for an
        instance of it), or None when unknown."""
        if isinstance(node, ast.Name) and node.id in ("self", "cls"):
            return OWN
        if isinstance(node, ast.Call) and dotted(node.func) == "super":
            return OWN
        if isinstance(node, ast.Attribute) and dotted(node) == f"self.{node.attr}":
            return self.fields.get(node.attr)
        chain = dotted(node)
        if chain is None:
            return None
        first, _, rest = chain.partition(".")
        for scope in reversed(self.scopes):
            types = self.types.get(id(scope))
            if types is None:
                types = self.types[id(scope)] = self.typed(scope)
            if first in types:
                return types[first] if not rest else None
        if first in self.imported:
            return ".".join(filter(None, [self.imported[first], rest]))
        return None

    def check_read(self, node: ast.Attribute) -> None:
        known = self.receiver(node.value)
        if known == OWN:
            return
        if known is not None:
            owner = self.index.owner(known)
            if owner is not None and owner != self.module:
                self.reach(node, (owner,))
            return
        if node.attr not in self.index.defines[self.module]:
            definers = [m for m in self.index.definers(node.attr) if m != self.module]
            if definers:
                self.reach(node, tuple(definers))

    def check_import(self, node: ast.ImportFrom) -> None:
        base = imported_from(self.index.packages[self.module], node)
        if is_ours(base) and base != self.module:
            for alias in node.names:
                if is_private(alias.name):
                    reach = Reach(self.module, node.lineno, alias.name, (base,), imported=True)
                    self.found.append(reach)

    def reach(self, node: ast.Attribute, owners: tuple[str, ...]) -> None:
        self.found.append(Reach(self.module, node.lineno, ast.unparse(node), owners))

    def visit(self, node: ast.AST) -> None:
        if isinstance(node, ast.ImportFrom):
            self.check_import(node)
        elif isinstance(node, ast.Attribute) and is_private(node.attr):
            self.check_read(node)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            self.scopes.append(node)
            self.visit_children(node)
            self.scopes.pop()
        elif isinstance(node, ast.ClassDef):
            outer, self.fields = self.fields, self.fields_of(node)
            self.visit_children(node)
            self.fields = outer
        else:
            self.visit_children(node)

    def visit_children(self, node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            self.visit(child)


def tested_by(test: str, owner: str) -> bool:
    """Whether the test module ``test`` is the unit test of ``owner``: its name mirrors the
    owner's (STYLE.md 13), ``tests/<area>/test_<name>.py`` or ``test_<name>_<aspect>.py`` for the
    module ``<name>`` of ``<area>`` (``tests/engine/test_kvstore.py`` and
    ``wschat.server.engine.local.kvstore``, ``tests/bench/test_llamacpp.py`` and
    ``bench.llamacpp``)."""
    parts = test.split(".")
    if len(parts) != 3 or parts[0] != "tests" or not parts[2].startswith("test_"):
        return False
    area, stem = parts[1], parts[2].removeprefix("test_")
    name = owner.rpartition(".")[2]
    return area in owner.split(".") and (stem == name or stem.startswith(f"{name}_"))


def allowed(reach: Reach) -> bool:
    """The one exception: a unit test may read (not import) a private name of the module it
    tests, the state that module keeps (a store's entries after an eviction, a sampler's
    generator to seed, a step to fail on purpose) where no public name shows it, rather than
    widen the module's interface for its test alone."""
    return not reach.imported and any(tested_by(reach.module, o) for o in reach.owners)


def private_reaches(index: Index, checked: Iterable[str]) -> list[Reach]:
    """Every read of another module's private name in the ``checked`` modules of ``index``."""
    return [reach for module in sorted(checked) for reach in Reader(index, module).found]
