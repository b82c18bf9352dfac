"""How a report names values: as the printer spells them, and by `partir.name`."""

from __future__ import annotations

from io import StringIO

from xdsl.dialects.builtin import DictionaryAttr, ModuleOp, StringAttr
from xdsl.ir import SSAValue
from xdsl.printer import Printer

from dialects.functions import NAME_ATTR


def ssa_names(module: ModuleOp) -> dict[SSAValue, str]:
    """Each value's name as the printer spells it (`%x_1`, `%42`): the names in
    the stage text. xDSL's Printer keeps the map it builds while printing."""
    printer = Printer(stream=StringIO())
    printer.print_op(module)
    return {v: f"%{n}" for v, n in printer._ssa_values.items()}


def _partir_name(attrs: DictionaryAttr | None) -> str | None:
    entry = attrs.data.get(NAME_ATTR) if attrs is not None else None
    return entry.data if isinstance(entry, StringAttr) else None
