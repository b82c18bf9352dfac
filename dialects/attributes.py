"""Python values of the integer-list attributes ops carry.

StableHLO keeps dimension lists in two forms (`array<i64: ...>` properties,
`ArrayAttr` of `IntegerAttr` in dimension-number attributes); the registry,
the interpreter and the emitter all read them with `ints`.
"""

from __future__ import annotations

from xdsl.dialects.builtin import ArrayAttr, DenseArrayBase, IntegerAttr
from xdsl.ir import Attribute


def ints(attr: Attribute) -> tuple[int, ...]:
    """The integers of a `DenseArrayBase` or an `ArrayAttr[IntegerAttr]`."""
    if isinstance(attr, DenseArrayBase):
        return tuple(int(v) for v in attr.get_values())
    if isinstance(attr, ArrayAttr) and all(isinstance(a, IntegerAttr) for a in attr.data):
        return tuple(int(a.value.data) for a in attr.data)
    raise TypeError(f"not an integer list: {attr}")
