"""Facts about an op that depend only on its class, found once per class.

Hot per-op paths (propagation's idle check, the SPMD lowering's dispatch,
loop relations) ask which kind an op is. An `isinstance` against xDSL's
op classes goes through ABC machinery and showed up in their profiles;
asking once per class and reading a dict after keeps `isinstance`'s meaning
(subclasses, such as `stablehlo_ext.WhileOp`, answer as their bases).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TypeVar

from xdsl.ir import Operation

T = TypeVar("T")


def per_op_kind(classify: Callable[[Operation], T]) -> Callable[[Operation], T]:
    """`classify`, computed for the first op of each class and remembered
    for its class (so it must read nothing but the op's class)."""
    found: dict[type[Operation], T] = {}

    @functools.wraps(classify)
    def by_kind(op: Operation) -> T:
        try:
            return found[type(op)]  # one lookup: most ops' class is known
        except KeyError:
            answer = found[type(op)] = classify(op)
            return answer

    return by_kind
