"""The report's rows: values, collectives, replicated ops, and the tables drawn from them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dialects.distribution import Distribution
from partir.report.render import UNKNOWN, _conflict_json, _list
from rewrites.conflicts import Conflict


@dataclass(frozen=True)
class ValueInfo:
    """One value of the entry function: its global and per-device shape, and how
    it is distributed (None where the lowering could not tell: never guessed)."""

    name: str
    op: str
    partir_name: str | None
    dtype: str
    local_shape: tuple[int, ...]
    bytes_per_device: int
    global_shape: tuple[int, ...] | None = None
    distribution: Distribution | None = None
    mesh_axes: tuple[str, ...] = ()
    """The mesh's axes, which `properties` and `sharding` describe the value over."""

    @property
    def properties(self) -> dict[str, str] | None:
        """DistPar's property per mesh axis: "S(d)" split on dim d, "B" broadcast, "P" partial."""
        return None if self.distribution is None else self.distribution.properties(self.mesh_axes)

    @property
    def sharding(self) -> str:
        return UNKNOWN if self.distribution is None else self.distribution.describe(self.mesh_axes)

    def to_json(self) -> dict[str, Any]:
        dist = self.distribution
        return {
            "name": self.name,
            "op": self.op,
            "partir_name": self.partir_name,
            "dtype": self.dtype,
            "global_shape": _list(self.global_shape),
            "dims": None if dist is None else [list(d) for d in dist.dims],
            "partial": None if dist is None else list(dist.partial),
            "properties": self.properties if self.properties is not None else UNKNOWN,
            "local_shape": list(self.local_shape),
            "bytes_per_device": self.bytes_per_device,
        }


@dataclass(frozen=True)
class CollectiveInfo:
    """One collective: what it moves per device, the op that needed it and
    where the user's code made that op (`source`: `file:line:col (in fn)`,
    `name_stack`: JAX's, when the stage has locations), the action (tactic
    and value) that made the value distributed, and the loop whose body runs
    it once per iteration, if any."""

    name: str
    kind: str
    axes: tuple[str, ...]
    operand: str
    result: str
    bytes_per_device: int
    needed_by: str | None
    action: int | None
    tactic: str | None
    value: str | None
    loop: str | None = None
    source: str | None = None
    name_stack: str | None = None

    @property
    def cause(self) -> str:
        if self.action is None:
            return "an unrecorded action"
        what = f" of {self.value}" if self.value else ""
        return f"action {self.action} ({self.tactic}{what})"

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "axes": list(self.axes),
            "operand": self.operand,
            "result": self.result,
            "bytes_per_device": self.bytes_per_device,
            "needed_by": self.needed_by,
            "action": self.action,
            "tactic": self.tactic,
            "value": self.value,
            "loop": self.loop,
            "source": self.source,
            "name_stack": self.name_stack,
        }


@dataclass(frozen=True)
class ReplicatedOp:
    """A core-stage op outside every loop (computed whole on every device), and why.

    `reason`: "opaque" (the registry has no rule; `detail` is its reason),
    "conflict" (a conflict record names it; `conflict` is the record),
    "blocked" (a tiled operand reached it, but the registry forbids that
    tiling; `detail` says why) or "untiled" (no tiled operand reached it).

    Propagation lets the earlier action win a conflict and tile the op, so an
    op named by a conflict record is normally inside the winner's loop and
    the loser's value is redistributed (a collective in the SPMD stage); the
    "conflict" reason appears only for core IR written or edited elsewhere.
    """

    name: str
    op: str
    reason: str
    detail: str
    conflict: Conflict | None = None
    reference: str | None = None
    """How a tactic names its value (`partir.values`): paste it as a
    `ManualPartition` key to tile it."""

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "op": self.op,
            "reason": self.reason,
            "detail": self.detail,
            "conflict": None if self.conflict is None else _conflict_json(self.conflict),
            "reference": self.reference,
        }


@dataclass(frozen=True)
class PaddedValue:
    """A value padded for divisibility (`rewrites.padding`): its `dims` as
    (dim, true size, padded size), the padding a multiple of `parts`."""

    name: str
    partir_name: str | None
    dims: tuple[tuple[int, int, int], ...]
    parts: int

    @property
    def text(self) -> str:
        who = self.partir_name or self.name
        sizes = ", ".join(f"dim {d} {n} -> {p}" for d, n, p in self.dims)
        return f"{who}: {sizes} (a multiple of {self.parts})"

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "partir.name": self.partir_name,
            "dims": [{"dim": d, "size": n, "padded": p} for d, n, p in self.dims],
            "parts": self.parts,
        }


