"""Where a module sets an attribute of a session from outside the module that defines it, read
from the source with ``ast`` (as private_names.py reads private names).

A session (``Session``, its ``SessionCore`` and its ``Chat``) is given its collaborators at
construction by one factory (``Hub``), and its state changes through its own methods alone: no
other module assigns, augments or deletes one of their attributes, nor ``setattr``s one
(``monkeypatch.setattr`` included). A write is seen on an object the source says is of one of
those classes (a name annotated as it or assigned a call of it, an attribute of ``self`` so
annotated, as private_names.py sees them, or assigned what a function or method of ours is
annotated to return, as ``hub.new_session()``; an attribute of one that its class was
constructed with, as ``session.core``, or a property of one annotated to return one, as
``session.chat``); or, where the object's class is unknown here, when the name is one that
those classes define and no other class of ours does (``session.core.state = ...`` in a test
that does not say what ``session`` is).
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from dataclasses import dataclass

from .import_graph import dotted
from .private_names import OWN, Index, Reader, class_names, imported_names

GUARDED = (
    "wschat.server.sessions.session.Session",
    "wschat.server.sessions.core.SessionCore",
    "wschat.server.engine.history.Chat",
)


@dataclass(frozen=True)
class Write:
    """``module`` writes ``written`` (as written, at ``line``), an attribute of a guarded class."""

    module: str
    line: int
    written: str


def class_node(index: Index, cls: str) -> ast.ClassDef | None:
    module, _, name = cls.rpartition(".")
    tree = index.trees.get(module)
    found = [n for n in tree.body if isinstance(n, ast.ClassDef)] if tree else []
    return next((n for n in found if n.name == name), None)


class Guarded:
    """The guarded classes of an index: the names each defines, the classes of the attributes
    each is constructed with (``self.core = core``, ``core: SessionCore``), and the names only
    they define among the classes of ours."""

    def __init__(self, index: Index, classes: Iterable[str] = GUARDED) -> None:
        self.names: dict[str, set[str]] = {}
        self.fields: dict[str, dict[str, str]] = {}
        for cls in classes:
            node = class_node(index, cls)
            if node is not None:
                self.names[cls] = class_names(node)
                self.fields[cls] = self._fields(index, cls, node)
        others: set[str] = set()
        for module, tree in index.trees.items():
            for node in (n for n in tree.body if isinstance(n, ast.ClassDef)):
                if f"{module}.{node.name}" not in self.names:
                    others |= class_names(node)
        self.only_theirs = set().union(*self.names.values()) - others
        self.functions: dict[str, str] = {}  # module.function -> the guarded class it returns
        methods: dict[str, set[str | None]] = {}  # a method's name -> what each returns
        for module in index.trees:
            for name, returned in returns_in(index, module):
                if "." in name.removeprefix(f"{module}."):
                    methods.setdefault(name.rpartition(".")[2], set()).add(returned)
                elif returned is not None:
                    self.functions[name] = returned
        # a method's name every definition of which returns one guarded class
        self.methods = {
            name: next(iter(returned))
            for name, returned in methods.items()
            if len(returned) == 1 and None not in returned
        }

    @staticmethod
    def _fields(index: Index, cls: str, node: ast.ClassDef) -> dict[str, str]:
        reader = Reader(index, cls.rpartition(".")[0])
        fields = reader.fields_of(node) | constructed_with(reader, node)
        for prop in node.body:
            if not isinstance(prop, ast.FunctionDef):
                continue
            returned = reader.class_of(prop.returns)
            if returned is not None and any(dotted(d) == "property" for d in prop.decorator_list):
                fields[prop.name] = returned
        return fields


def constructed_with(reader: Reader, node: ast.ClassDef) -> dict[str, str]:
    """``self.x`` -> its class, for each ``self.x = x`` in ``__init__`` of an argument ``x``
    annotated as a class of ours (``def __init__(self, core: SessionCore)``)."""
    fields: dict[str, str] = {}
    for init in node.body:
        if not (isinstance(init, ast.FunctionDef) and init.name == "__init__"):
            continue
        arguments = [*init.args.args, *init.args.kwonlyargs]
        given = {a.arg: c for a in arguments if (c := reader.class_of(a.annotation))}
        for assign in (n for n in ast.walk(init) if isinstance(n, ast.Assign)):
            value = assign.value
            for target in assign.targets:
                if (
                    isinstance(target, ast.Attribute)
                    and dotted(target) == f"self.{target.attr}"
                    and isinstance(value, ast.Name)
                    and value.id in given
                ):
                    fields[target.attr] = given[value.id]
    return fields


def returns_in(index: Index, module: str) -> Iterable[tuple[str, str | None]]:
    """Each function and method of ``module`` (``module.f``, ``module.Class.f``) and the guarded
    class it is annotated to return (None: another or none)."""
    tree = index.trees[module]
    imported = imported_names(tree, index.packages[module])
    scopes: list[tuple[str, ast.AST]] = [(module, tree)]
    scopes += [(f"{module}.{n.name}", n) for n in tree.body if isinstance(n, ast.ClassDef)]
    for prefix, scope in scopes:
        for node in getattr(scope, "body", []):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                returned = annotated_class(index, module, imported, node.returns)
                yield f"{prefix}.{node.name}", returned if returned in GUARDED else None


def annotated_class(
    index: Index, module: str, imported: dict[str, str], annotation: ast.expr | None
) -> str | None:
    """The dotted name an annotation (``X``, ``X | None``, ``"X"``) names, resolved."""
    if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
        annotation = ast.parse(annotation.value, mode="eval").body
    if isinstance(annotation, ast.BinOp):
        left = annotated_class(index, module, imported, annotation.left)
        return left or annotated_class(index, module, imported, annotation.right)
    chain = dotted(annotation) if isinstance(annotation, ast.expr) else None
    if chain is None:
        return None
    first, _, rest = chain.partition(".")
    name = ".".join(filter(None, [imported[first], rest])) if first in imported else None
    return index.resolve(name or f"{module}.{chain}")


class Writer(Reader):
    """Walks one module for writes to a guarded class's attributes."""

    def __init__(self, index: Index, module: str, guarded: Guarded) -> None:
        self.guarded = guarded
        self.writes: list[Write] = []
        tree = index.trees[module]
        self.own = {f"{module}.{n.name}" for n in tree.body if isinstance(n, ast.ClassDef)}
        self.own_names = set().union(
            *(class_names(n) for n in tree.body if isinstance(n, ast.ClassDef))
        )
        super().__init__(index, module)

    def fields_of(self, cls: ast.ClassDef) -> dict[str, str]:
        """As a reader sees them, and those its ``__init__`` is given (``self.session =
        session``, ``session: Session``)."""
        return super().fields_of(cls) | constructed_with(self, cls)

    def check_read(self, node: ast.Attribute) -> None:
        return None  # private_names.py's

    def check_import(self, node: ast.ImportFrom) -> None:
        return None

    def built(self, value: ast.expr | None) -> str | None:
        """The class a call makes: a class's, or a guarded one a function or method returns."""
        made = super().built(value)
        if made is not None or not isinstance(value, ast.Call):
            return made
        func = value.func
        if isinstance(func, ast.Name):
            name = self.imported.get(func.id, f"{self.module}.{func.id}")
            return self.guarded.functions.get(self.index.resolve(name))
        return self.guarded.methods.get(func.attr) if isinstance(func, ast.Attribute) else None

    def visit(self, node: ast.AST) -> None:
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store | ast.Del):
            self.check_write(node.value, node.attr, node)
        elif isinstance(node, ast.Call) and (dotted(node.func) or "").endswith("setattr"):
            args = node.args
            if len(args) >= 2 and isinstance(args[1], ast.Constant):
                self.check_write(args[0], str(args[1].value), node)
        super().visit(node)

    def class_at(self, node: ast.expr) -> str | None:
        """The class of ours ``node`` is known to be an instance of (OWN for ``self``)."""
        known = self.receiver(node)
        if known is None and isinstance(node, ast.Attribute):
            base = self.class_at(node.value)
            if base is not None and base != OWN:
                return self.guarded.fields.get(self.index.resolve(base), {}).get(node.attr)
        return known if known == OWN or known is None else self.index.resolve(known)

    def check_write(self, target: ast.expr, attribute: str, node: ast.AST) -> None:
        cls = self.class_at(target)
        if cls == OWN:
            return
        if cls is not None:
            if cls in self.guarded.names and cls not in self.own:
                self.found_write(node)
            return
        if attribute in self.guarded.only_theirs and attribute not in self.own_names:
            self.found_write(node)

    def found_write(self, node: ast.AST) -> None:
        line = getattr(node, "lineno", 0)
        self.writes.append(Write(self.module, line, ast.unparse(node)))


def outside_writes(index: Index, checked: Iterable[str]) -> list[Write]:
    """Every write to a guarded class's attribute in the ``checked`` modules of ``index``."""
    guarded = Guarded(index)
    return [write for module in sorted(checked) for write in Writer(index, module, guarded).writes]
