"""Where the user's code made an op: its location, kept from import to emission.

JAX gives each StableHLO op an MLIR location: the op's name stack
(`jit(step)/transpose(jvp())/dot_general`) around the Python call stack
that traced it. partir keeps, per op, the name stack and the innermost frame
as the op's builtin location (`Operation.location`):

    loc("jit(step)/jvp()/dot_general"("attention"("/src/layers.py":82:20)))

name stack, then the frame's function and its `file:line:column`. xDSL
prints locations only when asked (`partir-opt --print-debuginfo`, MLIR's
`--mlir-print-debuginfo`; `located_text`) and parses them back, so the IR
text stays as it was. `Operation.clone` keeps an op's location; an op rebuilt on its
operands' parts or padded shapes (`rewrites.tiling`, `rewrites.padding`)
takes the old op's, and the SPMD lowering gives the collectives and
redistributions it inserts the location of the op that needed them. The
emitted JAX program, `partir-inspect` and error messages read it here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import lru_cache
from io import StringIO
from typing import Any, cast

from xdsl.dialects.builtin import (
    UNKNOWN_LOC,
    ArrayAttr,
    CallSiteLoc,
    FileLineColLoc,
    FusedLoc,
    IntAttr,
    LocationAttr,
    NameLoc,
    NoneAttr,
    StringAttr,
    UnknownLoc,
)
from xdsl.ir import Attribute, BlockArgument, Operation
from xdsl.printer import Printer


@dataclass(frozen=True)
class SourceLocation:
    """What an op's location says: its JAX name stack and the user's frame
    (any of them may be missing: JAX derives some ops without a frame)."""

    name_stack: str | None = None
    file: str | None = None
    line: int = 0
    column: int = 0
    function: str | None = None

    @property
    def file_line(self) -> str | None:
        """`/src/layers.py:82`, or None without a frame."""
        return f"{self.file}:{self.line}" if self.file is not None else None

    @property
    def frame(self) -> str | None:
        """`/src/layers.py:82:20 (in attention)`, or None without a frame."""
        if self.file is None:
            return None
        where = f"{self.file}:{self.line}:{self.column}"
        return f"{where} (in {self.function})" if self.function else where

    def describe(self) -> str | None:
        """`/src/layers.py:82 jit(step)/jvp()/dot_general`: the frame's line,
        then the name stack; None when the location says neither. Unescaped:
        each printer escapes it for where it goes."""
        parts = [p for p in (self.file_line, self.name_stack) if p]
        return " ".join(parts) or None

    def attribute(self) -> LocationAttr:
        """The location in partir's form (see the module docstring)."""
        return _attribute(self)


@lru_cache(maxsize=4096)
def _attribute(where: SourceLocation) -> LocationAttr:
    """Built once per distinct location (attributes are immutable values, and
    building one costs tens of microseconds; an op's location is one of few)."""
    frame: LocationAttr | None = None
    if where.file is not None:
        frame = FileLineColLoc(StringAttr(where.file), IntAttr(where.line), IntAttr(where.column))
        if where.function and where.name_stack is not None:
            frame = NameLoc(StringAttr(where.function), frame)
    if where.name_stack is None:
        return frame if frame is not None else UNKNOWN_LOC
    return NameLoc(StringAttr(where.name_stack), frame if frame is not None else NoneAttr())


Name = tuple[str, Any]
"""A named location: (name, the location it names)."""
CallSite = tuple[Any]
"""A call site, by its callee (the innermost frame)."""
Fused = list[Any]
"""A fused location's parts."""
Position = tuple[str, int, int]
"""A file position: (file, line, column)."""

Step = Name | CallSite | Fused | Position | None
"""One node of a location, as `read_location` walks it (None: an unknown one)."""


def read_location(location: Any, step: Callable[[Any], Step]) -> SourceLocation:
    """Read a location as JAX writes them, whatever its classes (`step` says
    what each node is: xDSL's builtin locations here, jaxlib's in the
    importer): names around a call stack (the innermost name there is the
    name stack; JAX may put a label such as `debug_print:` around it), read
    at the innermost frame (a call site's callee), whose name is its
    function; without a call site, a name directly around the file position
    is the function when another name is around it. A fused location is read
    at its first part with a file."""
    names: list[str] = []
    outer: list[str] | None = None  # the names around the first call site
    node = step(location)
    while True:
        if isinstance(node, list):  # fused
            parts = [read_location(p, step) for p in node]
            with_file = [p for p in parts if p.file is not None]
            if with_file or parts:
                found = (with_file or parts)[0]
                if not names and outer is None:
                    return found
                node = (found.file, found.line, found.column) if found.file else None
            else:
                node = None
        if node is None or len(node) == 3:
            break
        if len(node) == 1:
            if outer is None:
                outer, names = names, []
            node = step(node[0])
        else:
            names.append(node[0])
            node = step(node[1])
    if outer is not None:
        stack, function = (outer[-1] if outer else None), (names[-1] if names else None)
    elif node is not None and len(names) > 1:
        stack, function = names[-2], names[-1]
    else:
        stack, function = (names[-1] if names else None), None
    if node is None:
        return SourceLocation(stack)
    file, line, column = node
    return SourceLocation(stack, file, line, column, function)


def _step(location: Any) -> Step:
    if isinstance(location, NameLoc):
        return (location.desc.data, location.location)
    if isinstance(location, CallSiteLoc):
        return (location.callee,)
    if isinstance(location, FusedLoc):
        return list(cast(ArrayAttr[Attribute], location.locations).data)
    if isinstance(location, FileLineColLoc):
        return (location.filename.data, location.line.data, location.column.data)
    return None


def source_location(location: Attribute) -> SourceLocation:
    """What an xDSL location says (`read_location`)."""
    return read_location(location, _step)


def in_scope(op: Operation, scope: str) -> bool:
    """Whether `op` was made under JAX named scope `scope` (a segment of its
    name stack, e.g. `attention` in `jit(f)/attention/dot_general`)."""
    stack = source_location(op.location).name_stack
    return stack is not None and scope in stack.split("/")


def is_unknown(location: Attribute) -> bool:
    # Not `isinstance`: attributes are ABCs, and the SPMD lowering asks per op.
    return type(location) is UnknownLoc


def give_location(ops: Iterable[Operation], location: LocationAttr) -> None:
    """Each of `ops` that has no location of its own takes `location`."""
    if isinstance(location, UnknownLoc):
        return
    for op in ops:
        if isinstance(op.location, UnknownLoc):
            op.location = location


def inlined_location(location: LocationAttr, call: LocationAttr) -> LocationAttr:
    """The location of an op of a private function inlined at `call`: JAX
    names such an op relative to the function (`max`, no frame), so its
    name stack continues the call's, and without a frame of its own it
    takes the call's (MLIR's inliner makes a call site of the two)."""
    inner, outer = source_location(location), source_location(call)
    if outer.name_stack is None and outer.file is None:
        return location
    stack = "/".join(s for s in (outer.name_stack, inner.name_stack) if s) or None
    frame = inner if inner.file is not None else outer
    return SourceLocation(stack, frame.file, frame.line, frame.column, frame.function).attribute()


class LocatedPrinter(Printer):
    """xDSL's printer, which with `print_debuginfo` prints each op's location
    but not its block arguments': partir gives them none, and the custom
    syntaxes that list block arguments (`stablehlo.reduce`'s reducer) do not
    parse a location there."""

    def print_block_argument(self, arg: BlockArgument, print_type: bool = True) -> None:
        debuginfo, self.print_debuginfo = self.print_debuginfo, False
        try:
            super().print_block_argument(arg, print_type)
        finally:
            self.print_debuginfo = debuginfo


def located_text(op: Operation) -> str:
    """`op` printed with its ops' locations (`LocatedPrinter`); parses back."""
    out = StringIO()
    LocatedPrinter(stream=out, print_debuginfo=True).print_op(op)
    return out.getvalue()
