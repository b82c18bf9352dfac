"""Compare `rewrites.factor_propagation`'s decisions with the rewrite engine's core IR.

Each op of the imported program is tagged with its index (an attribute the
rewrites copy onto every part and clone they make); after the rewrite engine
partitions one copy, each tagged op's result relation to the loops around it
(`LoopRelations`, what the SPMD lowering annotates) is what the engine
decided for it. Arguments are compared by what they arrive as
(`lowering.to_spmd.input_dist`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from xdsl.dialects.builtin import IntegerAttr, ModuleOp, TensorType, i64

from dialects.distribution import Distribution
from dialects.functions import entry_function
from lowering.to_spmd import input_dist
from partir import Mesh
from partir.partition import decide_partition, partition
from partir.tactics import Tactic
from rewrites.conflicts import Conflict
from rewrites.factor_propagation import Decision
from rewrites.projection import LoopRelations

TAG = "partir.decision_check"


@dataclass
class Comparison:
    ops: int = 0
    """Tagged single-result ops still in the core IR with a known relation."""
    mismatched: list[tuple[str, int, Distribution, set[Distribution]]] = field(
        default_factory=list
    )
    arguments: list[tuple[str, Distribution, Distribution]] = field(default_factory=list)
    conflicts: tuple[int, int] = (0, 0)
    """How many conflicts the decision and the engine recorded."""
    engine_conflicts: list[Conflict] = field(default_factory=list)
    decision: Decision | None = None

    @property
    def agree(self) -> bool:
        return not self.mismatched and not self.arguments


def compare(module: ModuleOp, mesh: Mesh, tactics: Sequence[Tactic]) -> Comparison:
    entry = entry_function(module)
    ops = [op for op in entry.walk() if op is not entry]
    for i, op in enumerate(ops):
        op.attributes[TAG] = IntegerAttr(i, i64)
    engine = module.clone()
    decision = decide_partition(module, mesh, tactics)
    done = partition(engine, mesh, tactics, engine="rewrite")
    core = entry_function(engine)
    relations = LoopRelations.of(core.body.block)
    seen: dict[int, set[Distribution]] = {}
    for op in core.walk():
        tag = op.attributes.get(TAG)
        if not isinstance(tag, IntegerAttr) or len(op.results) != 1:
            continue
        relation = relations(op.results[0])
        ty = ops[tag.value.data].results[0].type  # the global shape, before padding
        if relation.known and isinstance(ty, TensorType):
            dist = _meaningful(relation.dist, tuple(ty.get_shape()), mesh)
            seen.setdefault(tag.value.data, set()).add(dist)
    out = Comparison(decision=decision)
    out.conflicts = (len(decision.conflicts), len(done.conflicts))
    out.engine_conflicts = done.conflicts
    for i, dists in sorted(seen.items()):
        out.ops += 1
        mine = decision.distribution(ops[i].results[0])
        if dists != {mine}:
            out.mismatched.append((ops[i].name, i, mine, dists))
    for arg, core_arg in zip(entry.body.block.args, core.body.block.args, strict=True):
        theirs = input_dist(core_arg, mesh)
        mine = decision.argument_distribution(arg)
        if mine != theirs:
            out.arguments.append((arg.name_hint or str(arg.index), mine, theirs))
    return out


def _meaningful(dist: Distribution, shape: tuple[int, ...], mesh: Mesh) -> Distribution:
    """`dist` without splits of a dim smaller than its parts: the core IR
    describes a value recomputed in every iteration of a loop as split on a
    size-1 dim (a broadcast's expanded dim), which no device layout is."""
    dims = tuple(
        axes if n >= mesh.size_of(axes) else () for axes, n in zip(dist.dims, shape, strict=True)
    )
    return Distribution(dims, dist.partial)

