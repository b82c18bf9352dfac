"""Predict one step of an SPMD program on a machine described by a `Profile`.

Per op, a roofline over its local shapes (`op_costs`): the larger of its
FLOPs at the device's peak for its element type (a matmul at the fraction
of it its shape reaches, `Device.efficiency`) and its bytes at the memory
bandwidth (an operand a fused transpose reads in the other order at
`Device.transposed_rate`), plus the device's kernel overhead if it runs as
a kernel of its own. Per collective, α-β over the links its group crosses
(`collective_costs`), independent all-reduces combined into one as XLA
does. A `while` costs its trip count times its body (the count read
from JAX's `scan`/`fori_loop` form: a counter from a constant, compared
below a constant), a conditional its dearest branch. Peak memory
is the report's liveness estimate (`partir.report.memory`) with XLA's
fusion: an op `op_costs.fused` into its users holds no buffer.

The model assumes no overlap of communication with computation (`overlap`
= 0: the step is their sum), as XLA's CPU and default GPU schedules mostly
run them back to back; a profile of a machine that overlaps is a
calibration question, not a different formula.

Where devices run different branches, chosen by their position alone (a
pipeline's time steps: `dialects.interpreter.positions`), one device's sum
is not the step: each position is walked on its own branches with a clock,
and the program's collectives on those axes make clocks meet (a permute's
receiver waits for its sender, a group's members for the last of them).
The step is the last clock; a position's time between the first and the
last such conditional that it neither computes nor communicates is idle,
waiting for a neighbour (`PositionTimes`): a pipeline's bubble, as the
schedule and the stages' real costs make it.
"""

from __future__ import annotations

import functools
import itertools
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from xdsl.dialects import func
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Block, Operation
from xdsl_jax.dialects import stablehlo as shlo

from dialects.counted_loops import trip_count
from dialects.functions import entry_function
from dialects.heap import paused_gc
from dialects.interpreter.positions import Coords, Positions
from dialects.mesh import Mesh
from dialects.partir import find_mesh
from dialects.spmd import CollectiveOp, CollectivePermuteOp
from partir.cost.collective_costs import combined_seconds, op_seconds
from partir.cost.memory import fused_peak_bytes
from partir.cost.op_costs import Kind, fused, kind_of, op_cost
from partir.cost.profile import Profile
from partir.spmd_form import spmd_form


@dataclass(frozen=True)
class CollectiveEstimate:
    """One collective op: how many times a step runs it, and its seconds in all."""

    kind: str
    axes: tuple[str, ...]
    bytes_per_device: int
    count: int
    seconds: float


@dataclass(frozen=True)
class PositionTimes:
    """Devices that run different branches by their position along `axes`
    (a pipeline's stages): per position, the seconds it computes or
    communicates between the first and the last conditional on its position
    (`busy_seconds`), and that span's length on the critical path
    (`span_seconds`, the last clock less the first). The rest is idle."""

    axes: tuple[str, ...]
    positions: tuple[tuple[int, ...], ...]
    busy_seconds: tuple[float, ...]
    span_seconds: float

    @property
    def idle_seconds(self) -> tuple[float, ...]:
        return tuple(max(0.0, self.span_seconds - b) for b in self.busy_seconds)

    @property
    def bubble(self) -> float:
        """The idle fraction of the positions' time over the span: (S - 1) / (M + S - 1)
        for GPipe and 1F1B on S equal stages and M microbatches."""
        if self.span_seconds <= 0:
            return 0.0
        return sum(self.idle_seconds) / (len(self.positions) * self.span_seconds)

    def to_json(self) -> dict[str, Any]:
        return {
            "axes": list(self.axes),
            "positions": [list(p) for p in self.positions],
            "busy_seconds": list(self.busy_seconds),
            "span_seconds": self.span_seconds,
            "bubble": self.bubble,
        }

    def summary(self) -> list[tuple[str, str]]:
        axes = "×".join(self.axes)
        rows = [
            (
                f"positions over {axes}",
                f"span {self.span_seconds * 1e3:.3f} ms, idle {self.bubble:.1%} of it "
                "(the bubble)",
            )
        ]
        rows += [
            (
                f"  {axes}={','.join(map(str, p))}",
                f"busy {b * 1e3:.3f} ms, idle {i * 1e3:.3f} ms",
            )
            for p, b, i in zip(self.positions, self.busy_seconds, self.idle_seconds, strict=True)
        ]
        return rows


@dataclass(frozen=True)
class Estimate:
    """A predicted step on one profile (per device; see the module docstring)."""

    profile: str
    compute_seconds: float
    comm_seconds: float
    peak_bytes: int
    memory_capacity: float
    flops: float
    memory_traffic: float
    kernels: int
    by_kind: dict[str, float]
    """Compute seconds per op kind (matmul, elementwise, ...)."""
    collectives: list[CollectiveEstimate] = field(default_factory=list)
    overlap: float = 0.0
    """The fraction of the smaller of compute and communication assumed hidden."""
    unknown_trip_counts: int = 0
    """`while` loops whose trip count the program does not state (costed once)."""
    wait_seconds: float = 0.0
    """Where devices run different branches (`positions`): the time the
    device that finishes last spends waiting for others."""
    positions: PositionTimes | None = None
    """Per position, where devices run different branches by position (a
    pipeline's stages): its busy and idle time (the bubble)."""

    @property
    def seconds(self) -> float:
        hidden = self.overlap * min(self.compute_seconds, self.comm_seconds)
        return self.compute_seconds + self.comm_seconds + self.wait_seconds - hidden

    @property
    def bubble(self) -> float:
        """The idle fraction of a pipelined step's span (0 where every device
        runs the same program)."""
        return 0.0 if self.positions is None else self.positions.bubble

    @property
    def fits(self) -> bool:
        return self.peak_bytes <= self.memory_capacity

    @property
    def by_axes(self) -> dict[tuple[str, ...], float]:
        """Communication seconds per group of mesh axes."""
        found: dict[tuple[str, ...], float] = defaultdict(float)
        for c in self.collectives:
            found[c.axes] += c.seconds
        return dict(found)

    def to_json(self) -> dict[str, Any]:
        return {
            "profile": self.profile,
            "seconds": self.seconds,
            "compute_seconds": self.compute_seconds,
            "comm_seconds": self.comm_seconds,
            "overlap": self.overlap,
            "peak_bytes_per_device": self.peak_bytes,
            "fits": self.fits,
            "flops": self.flops,
            "memory_traffic_bytes": self.memory_traffic,
            "kernels": self.kernels,
            "compute_seconds_by_kind": self.by_kind,
            "comm_seconds_by_axes": {",".join(k): v for k, v in self.by_axes.items()},
            "collectives": [c.__dict__ for c in self.collectives],
            "unknown_trip_counts": self.unknown_trip_counts,
            "wait_seconds": self.wait_seconds,
            "positions": None if self.positions is None else self.positions.to_json(),
        }

    def summary(self) -> list[tuple[str, str]]:
        def ms(seconds: float) -> str:
            return f"{seconds * 1e3:.3f} ms"

        rows = [
            ("profile", self.profile),
            ("step", ms(self.seconds)),
            ("compute", f"{ms(self.compute_seconds)} ({self.flops / 1e9:.3f} GFLOP, "
             f"{self.memory_traffic / 1e6:.1f} MB of memory traffic, {self.kernels} kernels)"),
            ("communication", f"{ms(self.comm_seconds)} (overlap assumed: {self.overlap:.0%})"),
            ("peak memory", f"{self.peak_bytes / 2**20:.1f} MiB per device "
             f"({'fits' if self.fits else 'does not fit'} in "
             f"{self.memory_capacity / 2**30:.1f} GiB)"),
        ]
        rows += [(f"compute: {kind}", ms(s)) for kind, s in sorted(self.by_kind.items())]
        rows += [(f"comm over {'×'.join(a) or '-'}", ms(s)) for a, s in self.by_axes.items()]
        if self.unknown_trip_counts:
            rows.append(("loops costed once", f"{self.unknown_trip_counts} (trip count unknown)"))
        if self.positions is not None:
            rows.insert(4, ("waiting", f"{ms(self.wait_seconds)} (for other devices' data)"))
            rows += self.positions.summary()
        return rows


class _Walk:
    """Accumulates costs over a region tree, each op weighted by how often it runs."""

    def __init__(
        self,
        mesh: Mapping[str, int],
        profile: Profile,
        is_fused: Callable[[Operation], bool],
        positions: Positions | None = None,
        coords: Coords | None = None,
    ):
        """With `positions` and `coords`, a conditional on the position runs
        the branch the device at `coords` takes."""
        self.mesh, self.profile = mesh, profile
        self.positions, self.coords = positions, coords
        self.compute = 0.0
        self.flops = 0.0
        self.traffic = 0.0
        self.kernels = 0
        self.by_kind: dict[str, float] = defaultdict(float)
        self.collectives: dict[CollectiveOp, list[float]] = {}
        self.combined: dict[CollectiveOp, float] = {}
        """Seconds of the collectives XLA combines with others (`combined_seconds`)."""
        self.unknown = 0
        self.fused = is_fused

    def block(self, block: Block, times: float) -> None:
        self.combined.update(combined_seconds(block, self.mesh, self.profile))
        for op in block.ops:
            self.op(op, times)

    def op(self, op: Operation, times: float) -> None:
        if isinstance(op, func.ReturnOp) or op.name == "stablehlo.return":
            return
        kind = kind_of(op)
        if kind is Kind.COLLECTIVE:
            assert isinstance(op, CollectiveOp)
            seconds = self.combined.get(op)
            if seconds is None:
                seconds = op_seconds(op, self.mesh, self.profile)
            entry = self.collectives.setdefault(op, [0.0, 0.0])
            entry[0] += times
            entry[1] += seconds * times
            return
        if kind is Kind.CONTROL:
            self.control(op, times)
            return
        cost = op_cost(op, self.fused)
        device = self.profile.device
        rate = device.flops_per_second(cost.element_type) * device.efficiency(cost.smallest_dim)
        memory = cost.bytes / device.memory_bandwidth
        if cost.strided_bytes:
            memory += cost.strided_bytes / device.transposed_rate(cost.strided_operand)
        seconds = max(cost.flops / rate, memory)
        if cost.kernel:
            seconds += device.kernel_overhead_s
            self.kernels += round(times)
        self.compute += seconds * times
        self.by_kind[kind.value] += seconds * times
        self.flops += cost.flops * times
        self.traffic += (cost.bytes + cost.strided_bytes) * times

    def control(self, op: Operation, times: float) -> None:
        if op.name == "stablehlo.while":
            trips = trip_count(op)
            if trips is None:
                self.unknown += 1
                trips = 1
            cond, body = op.regions
            self.block(cond.block, times * (trips + 1))
            self.block(body.block, times * trips)
            return
        if self.positions is not None and self.coords is not None:
            assert isinstance(op, shlo.CaseOp | shlo.IfOp)
            if self.positions.selector_axes(op) is not None:  # this device's own branch
                self.block(self.positions.branch(op, self.coords).block, times)
                return
        # a conditional: every device runs one branch; cost the dearest
        best: _Walk | None = None
        for region in op.regions:
            branch = _Walk(self.mesh, self.profile, self.fused, self.positions, self.coords)
            branch.block(region.block, times)
            if best is None or branch.total() > best.total():
                best = branch
        if best is not None:
            self.absorb(best)

    def total(self) -> float:
        return self.compute + sum(s for _, s in self.collectives.values())

    def absorb(self, other: _Walk) -> None:
        self.compute += other.compute
        self.flops += other.flops
        self.traffic += other.traffic
        self.kernels += other.kernels
        self.unknown += other.unknown
        for kind, seconds in other.by_kind.items():
            self.by_kind[kind] += seconds
        self.collectives.update(other.collectives)


@paused_gc()
def estimate(module: ModuleOp, profile: Profile) -> Estimate:
    """The predicted step of the SPMD `module` on `profile` (a core-stage
    `module` is lowered first: `spmd_form`)."""
    module = spmd_form(module)
    is_fused = functools.cache(fused)  # one memo for the time and the memory walks
    peak_bytes = fused_peak_bytes(module, is_fused)  # the report's liveness, fused ops holding none
    mesh_op = find_mesh(module)
    if mesh_op is None:
        raise ValueError("the module declares no partir.mesh: estimate an SPMD module")
    mesh = mesh_op.axes
    positions = Positions(module, mesh_op.mesh)
    axes = _position_axes(module, positions, mesh_op.mesh)
    block = entry_function(module).body.block
    wait = 0.0
    times: PositionTimes | None = None
    if axes:
        walk, wait, times = _Clocks(block, axes, mesh_op.mesh, profile, is_fused, positions).run()
    else:
        walk = _Walk(mesh, profile, is_fused)
        walk.block(block, 1)
    collectives = [
        CollectiveEstimate(op.kind, op.axis_names, op.bytes_per_device, round(count), seconds)
        for op, (count, seconds) in walk.collectives.items()
    ]
    return Estimate(
        profile=profile.name,
        compute_seconds=walk.compute,
        comm_seconds=sum(c.seconds for c in collectives),
        peak_bytes=peak_bytes,
        memory_capacity=profile.device.memory_bytes,
        flops=walk.flops,
        memory_traffic=walk.traffic,
        kernels=walk.kernels,
        by_kind=dict(walk.by_kind),
        collectives=collectives,
        unknown_trip_counts=walk.unknown,
        wait_seconds=wait,
        positions=times,
    )


def _position_axes(module: ModuleOp, positions: Positions, mesh: Mesh) -> tuple[str, ...]:
    """The mesh axes some conditional's choice depends on (position alone), in mesh order."""
    found: set[str] = set()
    for op in module.walk():
        found |= positions.selector_axes(op) or set()
    return tuple(a for a in mesh if a in found)


class _Clocks:
    """The entry block walked once per position along `axes`, each with a
    clock that the top-level collectives on those axes synchronise."""

    def __init__(
        self,
        block: Block,
        axes: tuple[str, ...],
        mesh: Mesh,
        profile: Profile,
        is_fused: Callable[[Operation], bool],
        positions: Positions,
    ) -> None:
        self.block, self.axes, self.mesh, self.profile = block, axes, mesh, profile
        self.keys = list(itertools.product(*(range(mesh[a]) for a in axes)))
        combined = combined_seconds(block, mesh, profile)
        self.walks = {}
        for key in self.keys:
            walk = _Walk(mesh, profile, is_fused, positions, dict(zip(axes, key, strict=True)))
            walk.combined.update(combined)
            self.walks[key] = walk
        self.positions = positions

    def run(self) -> tuple[_Walk, float, PositionTimes]:
        """The walk of the device that finishes last, its waiting, and the
        positions' times over the span of the conditionals on position."""
        ops = list(self.block.ops)
        chosen = [
            i
            for i, op in enumerate(ops)
            if any(self.positions.selector_axes(inner) for inner in op.walk())
        ]
        first, last = chosen[0], chosen[-1]
        clock = dict.fromkeys(self.keys, 0.0)
        busy = dict.fromkeys(self.keys, 0.0)
        start = span = 0.0
        for i, op in enumerate(ops):
            if i == first:
                start = max(clock.values())
            before = {k: w.total() for k, w in self.walks.items()}
            if isinstance(op, CollectiveOp) and set(op.axis_names) & set(self.axes):
                clock = self._meet(op, clock)
            else:
                for w in self.walks.values():
                    w.op(op, 1)
            for k, w in self.walks.items():
                spent = w.total() - before[k]
                clock[k] += spent
                if first <= i <= last:
                    busy[k] += spent
            if i == last:
                span = max(clock.values()) - start
        times = PositionTimes(self.axes, tuple(self.keys), tuple(busy[k] for k in self.keys), span)
        key = max(self.keys, key=lambda k: (clock[k], self.walks[k].total()))
        walk = self.walks[key]
        return walk, max(0.0, clock[key] - walk.total()), times

    def _meet(
        self, op: CollectiveOp, clock: dict[tuple[int, ...], float]
    ) -> dict[tuple[int, ...], float]:
        """Clocks after a collective on the position axes: the devices it joins
        wait for each other (a permute's receiver for its sender) before it
        runs; its seconds are added by the walks (`_Walk.op`)."""
        met = dict(clock)
        over = op.axis_names
        if isinstance(op, CollectivePermuteOp) and set(over) <= set(self.axes):
            sources = {target: source for source, target in op.source_target_pairs}
            joined = {*sources, *sources.values()}
            for k in self.keys:
                coords = dict(zip(self.axes, k, strict=True))
                here = self.mesh.group_index(coords, over)
                if here not in joined:
                    continue  # neither sends nor receives: no time
                if here in sources:
                    there = self._moved(coords, over, sources[here])
                    met[k] = max(clock[k], clock[there])
                self.walks[k].op(op, 1)
            return met
        rest = [a for a in self.axes if a not in over]
        groups: dict[tuple[int, ...], list[tuple[int, ...]]] = {}
        for k in self.keys:
            coords = dict(zip(self.axes, k, strict=True))
            groups.setdefault(tuple(coords[a] for a in rest), []).append(k)
        for members in groups.values():
            latest = max(clock[k] for k in members)
            for k in members:
                met[k] = latest
                self.walks[k].op(op, 1)
        return met

    def _moved(self, coords: dict[str, int], over: tuple[str, ...], index: int) -> tuple[int, ...]:
        """The position whose group index along `over` is `index`, the others as `coords`."""
        moved = dict(coords)
        for axis in reversed(over):
            moved[axis] = index % self.mesh[axis]
            index //= self.mesh[axis]
        return tuple(moved[a] for a in self.axes)
