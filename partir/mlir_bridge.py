"""Build xDSL IR directly from jaxlib's in-memory MLIR module.

Printing JAX's module as text and parsing it with xDSL works, but xDSL's parser
builds and verifies every type and attribute afresh for each op (about 2 ms per
StableHLO op). Walking the MLIR objects instead, each distinct type or
attribute is parsed once (`AttributeCache`), so import cost is dominated by
creating the ops themselves. Attributes still go through xDSL's own parser, one
text at a time, so the result is exactly what parsing the module would give.
Each op keeps where the user's code made it: its location, read once per
distinct location into partir's form (`dialects.locations`).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from jaxlib.mlir import ir
from xdsl.context import Context
from xdsl.dialects.builtin import (
    ArrayAttr,
    DictionaryAttr,
    FunctionType,
    IntAttr,
    LocationAttr,
    ModuleOp,
    StringAttr,
    UnregisteredAttr,
    UnregisteredOp,
)
from xdsl.ir import Attribute, Block, Operation, Region, SSAValue
from xdsl.irdl import IRDLOperation
from xdsl.utils.exceptions import ParseError

from dialects.errors import UnsupportedError
from dialects.locations import SourceLocation, Step, read_location, source_location
from dialects.parser import PartirParser as Parser


class AttributeCache:
    """Parses MLIR attribute and type texts with xDSL, once per distinct text.

    xDSL attributes are immutable values, so one cache can serve every import
    made with the same dialects.
    """

    def __init__(self, ctx: Context):
        self._ctx = ctx
        self._attrs: dict[str, Attribute] = {}
        self._opaque: dict[str, Attribute] = {}
        self._types: dict[str, Attribute] = {}

    def convert(self, mlir_attr: Any) -> Attribute:
        """An op's jaxlib attribute: an array, a dictionary or a type read
        part by part (`_parts`), anything else by its text (`attribute`)."""
        if isinstance(mlir_attr, ir.ArrayAttr | ir.DictAttr | ir.TypeAttr):
            return self._parts(mlir_attr)
        return self.attribute(str(mlir_attr))

    def _parts(self, mlir_attr: Any) -> Attribute:
        """An array, a dictionary or a function type made of its parts, once
        per distinct text (one object per text, as parsing gave: the rule
        memo reads properties by identity), each part read once per distinct
        text: an entry function's signature and its per-argument
        dictionaries are one text each, thousands of characters of a few
        distinct types, and parsed whole they took a third of a 6-layer
        step's import. A part xDSL cannot read fails the whole attribute, as
        its text did (never kept opaque: an annotation inside it would be
        dropped)."""
        text = str(mlir_attr)
        found = self._attrs.get(text)
        if found is not None:
            return found
        if isinstance(mlir_attr, ir.ArrayAttr):
            found = ArrayAttr([self._parts(element) for element in mlir_attr])
        elif isinstance(mlir_attr, ir.DictAttr):
            entries = (mlir_attr[k] for k in range(len(mlir_attr)))
            found = DictionaryAttr({named.name: self._parts(named.attr) for named in entries})
        elif isinstance(mlir_attr, ir.TypeAttr) and isinstance(mlir_attr.value, ir.FunctionType):
            signature = mlir_attr.value
            found = FunctionType.from_lists(
                [self.type(str(t)) for t in signature.inputs],
                [self.type(str(t)) for t in signature.results],
            )
        else:
            return self._read(text)
        self._attrs[text] = found
        return found

    def attribute(self, text: str) -> Attribute:
        """xDSL's reading of the text; an attribute xDSL cannot read (e.g.
        `#stablehlo.conv<...>` of an op xdsl-jax lacks) is kept opaque, printed
        back verbatim, so its op still imports and fails later by name."""
        found = self._opaque.get(text)
        if found is not None:
            return found
        try:
            return self._read(text)
        except ParseError:
            if not text.startswith("#") or "<" not in text:
                raise
        name, _, body = text[1:].partition("<")
        opaque = UnregisteredAttr.with_name_and_type(name, False)
        found = self._opaque[text] = opaque(
            StringAttr(name), IntAttr(0), IntAttr(0), StringAttr("<" + body)
        )
        return found

    def _read(self, text: str) -> Attribute:
        attr = self._attrs.get(text)
        if attr is None:
            attr = self._attrs[text] = Parser(self._ctx, text).parse_attribute()
        return attr

    def type(self, text: str) -> Attribute:
        ty = self._types.get(text)
        if ty is None:
            ty = self._types[text] = Parser(self._ctx, text).parse_type()
        return ty


def _unsafe_attributes(mlir_op: Any) -> bool:
    """Whether reading the op's attributes through jaxlib would abort the
    process: its bindings cannot cast complex dense attributes (a C++ error,
    not a Python exception)."""
    return mlir_op.name.endswith(".constant") and any(
        "complex<" in str(r.type) for r in mlir_op.results
    )


def jax_step(location: Any) -> Step:
    """A node of a jaxlib location, for `dialects.locations.read_location`
    (a file range is read at its start)."""
    if isinstance(location, ir.NameLoc):
        return (location.name_str, location.child_loc)
    if isinstance(location, ir.CallSiteLoc):
        return (location.callee,)
    if isinstance(location, ir.FusedLoc):
        return list(location.locations)
    if isinstance(location, ir.FileLineColLoc):
        return (location.filename, location.start_line, location.start_col)
    return None


def _nowhere(path: str) -> bool:
    return False


USER_FRAME_OPS = frozenset({"sdy.sharding_constraint"})
"""Ops located at the user's own line rather than the innermost frame: an
annotation made through a library (flax's `nn.with_logical_constraint`
calls `with_sharding_constraint` in flax's own file) is the user's where
they called the library, which the report names it by."""

_LIBRARY_DIRS = ("site-packages", "dist-packages")


def _frames(location: Any) -> list[tuple[str | None, Any]]:
    """The call stack of a jaxlib location, innermost first: each frame's
    function name (None if unnamed) and its file position."""
    frames: list[tuple[str | None, Any]] = []
    node, name = location, None
    while node is not None:
        if isinstance(node, ir.NameLoc):
            name, node = node.name_str, node.child_loc
        elif isinstance(node, ir.CallSiteLoc):
            frames += _frames(node.callee)
            node, name = node.caller, None
        elif isinstance(node, ir.FileLineColLoc):
            frames.append((name, node))
            break
        else:
            break
    return frames


def _in_user_code(located: LocationAttr, location: Any) -> LocationAttr:
    """`located`, at the innermost frame outside installed libraries when
    its own frame is inside one (`USER_FRAME_OPS`)."""
    where = source_location(located)
    if where.file is None or not any(d in where.file.split(os.sep) for d in _LIBRARY_DIRS):
        return located
    for function, frame in _frames(location):
        parts = frame.filename.split(os.sep)
        if not any(d in parts for d in _LIBRARY_DIRS):
            return SourceLocation(
                where.name_stack, frame.filename, frame.start_line, frame.start_col, function
            ).attribute()
    return located


class MlirToXdsl:
    """Converts a jaxlib `ir.Module` (or any MLIR op) into the same xDSL IR.

    Ops whose name the context does not know become `UnregisteredOp`s, so a
    program that uses an op partir cannot yet handle still imports; the stage
    that needs to understand the op reports it by name. Frames in files
    `internal` names are not the user's (`source_location`).
    """

    def __init__(
        self,
        ctx: Context,
        cache: AttributeCache | None = None,
        *,
        internal: Callable[[str], bool] = _nowhere,
    ):
        self._ctx = ctx
        self._internal = internal
        self._cache = cache if cache is not None else AttributeCache(ctx)
        self._values: dict[Any, SSAValue] = {}
        self._op_types: dict[str, tuple[type[Operation], frozenset[str]]] = {}
        self._locations: dict[Any, LocationAttr] = {}

    @property
    def op_names(self) -> frozenset[str]:
        """The names of the ops converted so far (an import that made no op
        of a kind need not walk the program for it)."""
        return frozenset(self._op_types)

    def convert_module(self, mlir_module: Any) -> ModuleOp:
        module = self.convert_op(mlir_module.operation)
        assert isinstance(module, ModuleOp)
        return module

    def _op_type(self, name: str) -> tuple[type[Operation], frozenset[str]]:
        """The xDSL class for `name` and the names it keeps as properties."""
        found = self._op_types.get(name)
        if found is None:
            op_type = self._ctx.get_optional_op(name)
            if op_type is None:
                found = (UnregisteredOp.with_name(name), frozenset())
            elif issubclass(op_type, IRDLOperation):
                found = (op_type, frozenset(op_type.get_irdl_definition().properties))
            else:
                found = (op_type, frozenset())
            self._op_types[name] = found
        return found

    def convert_op(self, mlir_op: Any) -> Operation:
        if _unsafe_attributes(mlir_op):
            return self._parse_standalone(mlir_op)
        op_type, property_names = self._op_type(mlir_op.name)
        properties: dict[str, Attribute] = {}
        attributes: dict[str, Attribute] = {}
        named = mlir_op.attributes
        for key in named:
            mlir_attr = named[key]
            try:
                attr = self._cache.convert(mlir_attr)
            except ParseError as err:
                what = f"its attribute {key} = {mlir_attr}"
                raise self._unreadable(mlir_op, what, err) from None
            (properties if key in property_names else attributes)[key] = attr
        regions = [self._convert_region(r) for r in mlir_op.regions]
        operands = [self._values[v] for v in mlir_op.operands]
        try:
            result_types = [self._cache.type(str(r.type)) for r in mlir_op.results]
        except ParseError as err:
            raise self._unreadable(mlir_op, "its result types", err) from None
        location = self._location(mlir_op.location)
        if mlir_op.name in USER_FRAME_OPS:
            location = _in_user_code(location, mlir_op.location)
        op = op_type.create(
            operands=operands,
            result_types=result_types,
            properties=properties,
            attributes=attributes,
            location=location,
            regions=regions,
        )
        for mlir_result, result in zip(mlir_op.results, op.results, strict=True):
            self._values[mlir_result] = result
        return op

    def _unreadable(self, mlir_op: Any, what: str, err: ParseError) -> UnsupportedError:
        """A `PartirError` for an op partir cannot read: the op, where the
        user's code made it, what part of it and xDSL's reason (never xDSL's
        bare `ParseError`)."""
        where = source_location(self._location(mlir_op.location)).frame
        at = f" (at {where})" if where else ""
        return UnsupportedError(
            f"cannot import {mlir_op.name}{at}: partir cannot read {what:.300}: "
            f"{err.msg}; compute it outside the partir.jit function, "
            "or file an issue with this op"
        )

    def _location(self, location: Any) -> LocationAttr:
        """`location` in partir's form (`dialects.locations`: the name stack
        and the innermost frame, unless that frame is in a file `internal`
        names: JAX places the ops it derives at the call that lowered the
        function, which may be the importer's own), read once per distinct
        location (MLIR uniques them: their attributes hash by identity)."""
        key = location.attr
        found = self._locations.get(key)
        if found is None:
            read = read_location(location, jax_step)
            if read.file is not None and self._internal(read.file):
                read = SourceLocation(read.name_stack)
            found = self._locations[key] = read.attribute()
        return found

    def _parse_standalone(self, mlir_op: Any) -> Operation:
        """An op with no operands or regions, read from its own generic text
        (used where jaxlib cannot hand its attributes over)."""
        if len(mlir_op.operands) or len(mlir_op.regions):
            raise NotImplementedError(
                f"cannot import {mlir_op.name}: jaxlib cannot expose its attributes "
                "(complex-valued), and it has operands or regions"
            )
        text = mlir_op.get_asm(print_generic_op_form=True)
        op = Parser(self._ctx, text).parse_op()
        op.location = self._location(mlir_op.location)
        for mlir_result, result in zip(mlir_op.results, op.results, strict=True):
            self._values[mlir_result] = result
        return op

    def _convert_region(self, mlir_region: Any) -> Region:
        blocks = []
        for mlir_block in mlir_region.blocks:
            block = Block(arg_types=[self._cache.type(str(a.type)) for a in mlir_block.arguments])
            for mlir_arg, arg in zip(mlir_block.arguments, block.args, strict=True):
                self._values[mlir_arg] = arg
            for mlir_op in mlir_block.operations:
                block.add_op(self.convert_op(mlir_op.operation))
            blocks.append(block)
        return Region(blocks)
