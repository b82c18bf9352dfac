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
"""

from __future__ import annotations

import functools
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from xdsl.dialects import func
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Block, Operation

from dialects.counted_loops import trip_count
from dialects.functions import entry_function
from dialects.heap import paused_gc
from dialects.partir import find_mesh
from dialects.spmd import CollectiveOp
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

    @property
    def seconds(self) -> float:
        hidden = self.overlap * min(self.compute_seconds, self.comm_seconds)
        return self.compute_seconds + self.comm_seconds - hidden

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
        return rows


class _Walk:
    """Accumulates costs over a region tree, each op weighted by how often it runs."""

    def __init__(
        self,
        mesh: Mapping[str, int],
        profile: Profile,
        is_fused: Callable[[Operation], bool],
    ):
        self.mesh, self.profile = mesh, profile
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
        # a conditional: every device runs one branch; cost the dearest
        best: _Walk | None = None
        for region in op.regions:
            branch = _Walk(self.mesh, self.profile, self.fused)
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
    walk = _Walk(mesh, profile, is_fused)
    walk.block(entry_function(module).body.block, 1)
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
    )
