"""What a tactic sees and decides: the program's named leaves, and its plan.

A tactic (`partir.tactics`) looks at the entry function's arguments and
results by their pytree paths (`ProgramView`) and returns a `Plan`: the
tiles to take and the leaves it looked at and left as they are, each with
the role the tactic took it for and why. The tiles are what `partir.passes`
applies; the whole plan is what the report shows (`partir.selections`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import cached_property

from xdsl.dialects import func
from xdsl.dialects.builtin import TensorType
from xdsl.ir import Attribute

from dialects.errors import PartirValueError
from dialects.escaping import readable
from dialects.functions import NAME_ATTR
from lowering.to_spmd import input_slices
from partir.annotations import Annotation, read_annotations
from partir.mesh import Mesh
from partir.roles import Roles
from partir.selections import Selection
from partir.selectors import POSITIONAL_ROOT, argument_root, display_path, select
from rewrites.projection import tilings


class TacticError(PartirValueError):
    """A tactic that cannot apply to this program on this mesh."""


@dataclass(frozen=True)
class Leaf:
    """One argument or result of the entry function, with its pytree path."""

    kind: str  # "argument" or "result"
    index: int
    name: str
    type: Attribute

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.type.get_shape()) if isinstance(self.type, TensorType) else ()

    @property
    def root(self) -> str:
        return argument_root(self.name)


@dataclass(frozen=True)
class ProgramView:
    """The names a tactic can select: the entry function's leaves, and the
    shardings the program states itself (`partir.annotations`)."""

    arguments: tuple[Leaf, ...]
    results: tuple[Leaf, ...]
    splits: Mapping[str, tuple[tuple[int, str], ...]] = field(default_factory=dict)
    """Leaf name -> the (dim, axis) splits every use of an argument takes
    (`lowering.to_spmd.input_slices`), or the loops that make a result
    (`rewrites.projection.tilings`), as the tactics before and propagation
    left the program: a tactic that picks a dim from a leaf's shape reads
    the per-device one (`local_shape`)."""
    annotations: tuple[Annotation, ...] = ()

    @cached_property
    def roles(self) -> Roles:
        """What each leaf is (parameters, optimizer state, data...): found
        once per program, whichever tactics ask (`partir.roles`)."""
        return Roles.of(self.arguments, self.results)

    def local_shape(self, leaf: Leaf, mesh: Mesh) -> tuple[int, ...]:
        """`leaf`'s shape on one device after the earlier tactics' splits
        (rounded up where an axis does not divide a dim: the padded part)."""
        shape = list(leaf.shape)
        for dim, axis in self.splits.get(leaf.name, ()):
            if dim < len(shape) and axis in mesh.axes:
                shape[dim] = -(-shape[dim] // mesh.axes[axis])
        return tuple(shape)

    @staticmethod
    def of(entry: func.FuncOp) -> ProgramView:
        def names(attrs, count: int, default: str) -> list[str]:
            if attrs is None:
                return [f"{default}[{i}]" for i in range(count)]
            out = []
            for i, d in enumerate(attrs.data):
                name = d.data.get(NAME_ATTR)
                out.append(name.data if name is not None else f"{default}[{i}]")
            return out

        ins, outs = entry.function_type.inputs.data, entry.function_type.outputs.data
        arg_names = names(entry.arg_attrs, len(ins), POSITIONAL_ROOT)
        res_names = names(entry.res_attrs, len(outs), "result")
        splits = {
            name: tuple(sliced)
            for name, arg in zip(arg_names, entry.body.block.args, strict=True)
            if (sliced := input_slices(arg))
        }
        ret = entry.body.block.last_op
        if isinstance(ret, func.ReturnOp):
            for name, value in zip(res_names, ret.arguments, strict=True):
                if tiled := [(t.dim, t.axis) for t in tilings(value)]:
                    splits[name] = tuple(tiled)
        return ProgramView(
            tuple(
                Leaf("argument", i, n, t)
                for i, (n, t) in enumerate(zip(arg_names, ins, strict=True))
            ),
            tuple(
                Leaf("result", i, n, t)
                for i, (n, t) in enumerate(
                    zip(res_names, outs, strict=True)
                )
            ),
            splits,
            read_annotations(entry, arg_names, res_names),
        )

    def find(
        self,
        patterns: str | Iterable[str],
        *,
        who: str,
        results: bool = False,
        required: bool = True,
    ) -> list[Leaf]:
        leaves = self.results if results else self.arguments
        pats = [patterns] if isinstance(patterns, str) else list(patterns)
        found = [leaves[i] for i in select(pats, [leaf.name for leaf in leaves])]
        if required and not found:
            shown = ", ".join(display_path(leaf.name) for leaf in leaves[:12])
            more = f", ... ({len(leaves)} in all)" if len(leaves) > 12 else ""
            kind = "result" if results else "argument"
            raise TacticError(
                f"{who}: no {kind} matches {', '.join(map(repr, pats))}; "
                f"the {kind}s are: {shown}{more}"
            )
        return found


@dataclass(frozen=True)
class ScopedValue:
    """A value inside the program rather than a leaf: the last op result of
    `shape` made under JAX named scope `scope` (`dialects.locations.in_scope`),
    found when the tile is taken, before the plan's propagation. How a tactic
    names an intermediate value: the ONNX import traces each node in a scope
    of its own."""

    scope: str
    name: str
    shape: tuple[int, ...]


@dataclass(frozen=True)
class ReferencedValue:
    """A value inside the program named by its `@`-reference
    (`partir.values`), found when the tile is taken, on the program the
    tactics before it left. How `ManualPartition` and the `Automatic`
    search name the values where propagation stopped."""

    name: str
    """The reference text, `@jit(step)/tanh at model.py:12#1`."""


@dataclass(frozen=True)
class AnnotatedValue:
    """The value the `ordinal`-th `sdy.sharding_constraint` of the entry
    (program order) constrains, or (`kind` a manual region's) operand or
    result `position` of its `ordinal`-th manual region, found when the tile
    is taken (`partir.annotations.annotated_value`); `name` is what the
    report calls it (`partir.annotations.Annotation.value`)."""

    ordinal: int
    name: str
    kind: str = "constraint"
    position: int = 0


@dataclass(frozen=True)
class PlannedTile:
    """Tile `leaf` along `dim` over mesh `axis`; `role` is what the tactic took
    the leaf for ("data", "column weight", ...) and `reason` why, for the
    report (`partir.selections`); `label`, if given, is what the action's
    origin and conflicts call the value (by default the leaf's name)."""

    leaf: Leaf | ScopedValue | ReferencedValue | AnnotatedValue
    dim: int
    axis: str
    role: str = "named"
    reason: str = ""
    label: str = ""


@dataclass(frozen=True)
class PassedLeaf:
    """A leaf a tactic looked at and leaves as it is (BatchParallel's state,
    ZeRO's scalars; a value an annotation keeps whole), with its role and why."""

    leaf: Leaf | AnnotatedValue
    role: str
    reason: str


@dataclass(frozen=True)
class ReturnedWhole:
    """A result the tactic returns whole over `axis`, however the tiles split
    the value that computes it (`dialects.functions.WHOLE_OVER`)."""

    leaf: Leaf
    axis: str
    role: str
    reason: str


@dataclass(frozen=True)
class Plan:
    """What one tactic decided: the tiles to take, in order, and the leaves it
    looked at and left as they are."""

    tactic: str
    tiles: tuple[PlannedTile, ...]
    passed: tuple[PassedLeaf, ...] = ()
    label: str = ""
    """The tactic as the report names it ("ZeRO-3(batch)"); `tactic` if empty."""
    whole: tuple[ReturnedWhole, ...] = ()
    """Results returned whole over an axis (ZeRO-1's updated parameters)."""
    removes_annotations: bool = False
    """Whether applying the plan takes JAX's shardings out of the program
    (`partir.annotations.remove_annotations`): `Annotations`' plan, whose
    tiles are those shardings."""

    def __iter__(self) -> Iterator[PlannedTile]:
        return iter(self.tiles)

    def __len__(self) -> int:
        return len(self.tiles)

    def selections(self) -> list[Selection]:
        """Every decision, in the leaves' order (arguments, then results),
        then the values inside the program it named by reference or that
        the program's own annotations name."""
        label = self.label or self.tactic
        decided = [
            (t.leaf, Selection(label, t.leaf.name, t.dim, t.axis, t.role, t.reason))
            for t in self.tiles
            if isinstance(t.leaf, Leaf)
        ]
        passed = [(p.leaf, Selection(label, p.leaf.name, None, "", p.role, p.reason))
                  for p in self.passed]
        decided += [(leaf, s) for leaf, s in passed if isinstance(leaf, Leaf)]
        decided += [
            (w.leaf, Selection(label, w.leaf.name, None, w.axis, w.role, w.reason))
            for w in self.whole
        ]
        decided.sort(key=lambda d: (d[0].kind == "result", d[0].index))
        referenced = [
            Selection(label, t.leaf.name, t.dim, t.axis, t.role, t.reason)
            for t in self.tiles
            if isinstance(t.leaf, ReferencedValue | AnnotatedValue)
        ] + [s for leaf, s in passed if isinstance(leaf, AnnotatedValue)]
        return [selection for _, selection in decided] + referenced


def tactic_label(tactic: str, *axes: str) -> str:
    """`BatchParallel(batch)`: a tactic and its axes, each readable on one line."""
    return f"{tactic}({', '.join(readable(str(a)) for a in axes)})"
