"""The xDSL context every stage of partir parses and builds in."""

from __future__ import annotations

from xdsl.context import Context
from xdsl.dialects.arith import Arith
from xdsl.dialects.builtin import Builtin
from xdsl.dialects.func import Func

from dialects.chlo import CHLO
from dialects.partir import Partir
from dialects.sdy import SDY
from dialects.spmd import SPMD
from dialects.stablehlo_ext import StableHLO

DIALECTS = (Builtin, Func, Arith, StableHLO, CHLO, SDY, Partir, SPMD)


def make_context(*, allow_unregistered: bool = False) -> Context:
    """A context with builtin, func, arith, StableHLO, CHLO, sdy, partir and spmd loaded."""
    ctx = Context(allow_unregistered=allow_unregistered)
    for dialect in DIALECTS:
        ctx.load_dialect(dialect)
    return ctx
