"""A machine as the cost model sees it: one device's roofline and the links
between devices, as plain data that loads from and saves to JSON.

Devices are numbered the way a mesh lays them out (row-major over its axes,
the last axis fastest), and grouped by `levels`, innermost first: an 8-GPU
node is one level of 8 joined by NVLink; 16 such nodes add a level of 16
joined by InfiniBand. A mesh axis's collective runs over the devices that
differ only in that axis's coordinate; `Profile.axis_levels` says how many
of them share each level, so an axis may span links (8 GPUs in a node x 2
nodes), as the ONNX multi-device proposal's topology section describes.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from dialects.errors import PartirValueError
from partir.generated_files import write_private

RING = "ring"
"""A level whose collectives are rings over its links (NCCL, TPU ICI): a
group of n pays n - 1 latencies and (n - 1)/n of the bytes per pass."""
SHARED_MEMORY = "shared_memory"
"""A level of devices in one process (XLA's CPU devices): a collective is a
rendezvous of the devices' threads, then each copies its bytes through the
host's memory, whatever the group's size (`collective_costs`)."""
ALGORITHMS = (RING, SHARED_MEMORY)


@dataclass(frozen=True)
class Link:
    """One level of the device hierarchy: `size` groups of the level below
    (devices, for the innermost) joined by links of this latency and
    per-device, per-direction bandwidth, whose collectives run as
    `algorithm` says. `per_kind` holds a collective kind's own latency and
    bandwidth where it was measured apart ("all_gather": (α, β)); the
    others take the link's."""

    name: str
    size: int
    latency_s: float
    bandwidth: float
    """Bytes per second one device sends (and receives) over this level."""
    algorithm: str = RING
    per_kind: dict[str, tuple[float, float]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.algorithm not in ALGORITHMS:
            raise PartirValueError(
                f"link {self.name!r}: unknown collective algorithm {self.algorithm!r}; "
                f"expected one of {list(ALGORITHMS)}"
            )
        # JSON gives lists: hold tuples, so a loaded profile equals the saved one
        object.__setattr__(
            self, "per_kind", {k: (float(a), float(b)) for k, (a, b) in self.per_kind.items()}
        )

    def alpha_beta(self, kind: str) -> tuple[float, float]:
        """(latency in seconds, bytes per second) of collective `kind` here."""
        return self.per_kind.get(kind, (self.latency_s, self.bandwidth))


def _log_linear(
    points: tuple[tuple[int, float], ...], x: float, *, log_value: bool
) -> float:
    """The measured `points` (x, value) at `x` from the first point on:
    log-linear in x between two (and in the value too, with `log_value`),
    the last's past the last."""
    if x >= points[-1][0]:
        return points[-1][1]
    for (x0, v0), (x1, v1) in itertools.pairwise(points):
        if x0 <= x <= x1:
            t = math.log(x / x0) / math.log(x1 / x0)
            if log_value:
                return math.exp(math.log(v0) + t * (math.log(v1) - math.log(v0)))
            return v0 + t * (v1 - v0)
    return points[-1][1]  # unreachable: the points cover the range

@dataclass(frozen=True)
class Device:
    """One device's roofline: peak FLOP/s per element type, memory bandwidth
    and capacity, a fixed cost per kernel (launch, or XLA's per-fusion
    overhead on CPU), how a matmul's rate falls with its smallest
    dimension (a 512x32x2048 matmul runs at 40% of a 512³ one on the CPU
    host: the kernel's blocks are mostly loads and stores), and how fast an
    elementwise kernel reads an operand it transposes (a gradient the update
    reads in the parameter's layout: on the CPU host, at a tenth of the
    memory bandwidth once it leaves the caches)."""

    peak_flops: dict[str, float]
    """Per MLIR element type name ("f32", "bf16", "f16", "i8", ...)."""
    memory_bandwidth: float
    memory_bytes: float
    kernel_overhead_s: float = 0.0
    matmul_efficiency: tuple[tuple[int, float], ...] = ()
    """(smallest of M, N and K, fraction of the peak) measured, by dimension;
    between two, log-linear; below the first, in proportion to the
    dimension; past the last, the last's. Empty: every matmul at the peak."""
    transposed_bandwidth: tuple[tuple[int, float], ...] = ()
    """(bytes of a transposed operand per device, bytes per second an
    elementwise kernel reads it at) measured, by size (`calibrate`: a 2-D
    f32 transpose fused into a multiply); between two, log-linear (size and
    rate); outside, the nearest's. Empty (a profile that did not measure
    it): the memory bandwidth, as a streamed operand."""

    def __post_init__(self) -> None:
        # JSON gives lists: hold sorted tuples, so a loaded profile equals the saved one
        points = tuple(sorted((int(d), float(f)) for d, f in self.matmul_efficiency))
        object.__setattr__(self, "matmul_efficiency", points)
        strided = tuple(sorted((int(b), float(r)) for b, r in self.transposed_bandwidth))
        object.__setattr__(self, "transposed_bandwidth", strided)

    def transposed_rate(self, nbytes: float) -> float:
        """Bytes per second an elementwise kernel reads a transposed operand
        of `nbytes` per device at (`transposed_bandwidth`)."""
        points = self.transposed_bandwidth
        if not points:
            return self.memory_bandwidth
        if nbytes <= points[0][0]:
            return points[0][1]
        return _log_linear(points, nbytes, log_value=True)

    def efficiency(self, smallest_dim: int) -> float:
        """The fraction of the peak a matmul whose smallest dimension (of M,
        N and K) is `smallest_dim` reaches (`matmul_efficiency`)."""
        points = self.matmul_efficiency
        if not points or smallest_dim <= 0:
            return 1.0
        first = points[0]
        if smallest_dim <= first[0]:
            return first[1] * smallest_dim / first[0]
        return _log_linear(points, smallest_dim, log_value=False)

    def flops_per_second(self, element_type: str) -> float:
        """The peak for `element_type`, else f32's (an integer or unlisted
        float type runs at the f32 rate)."""
        peak = self.peak_flops.get(element_type) or self.peak_flops.get("f32")
        if not peak:
            raise PartirValueError(
                f"the device profile has no peak FLOP/s for {element_type} or f32; "
                f"it lists {sorted(self.peak_flops)}"
            )
        return peak


@dataclass(frozen=True)
class Profile:
    """A device, the levels linking devices (innermost first), and where the
    figures come from."""

    name: str
    device: Device
    levels: tuple[Link, ...]
    sources: tuple[str, ...] = field(default=())
    platform: str = ""
    """JAX's platform name ("cpu", "gpu", "tpu") where known: partir's lowering
    writes some collectives differently per platform (`collective_costs.RUN_AS`)."""

    @property
    def devices(self) -> int:
        return math.prod(level.size for level in self.levels)

    def axis_levels(self, mesh: Mapping[str, int], axes: tuple[str, ...]) -> list[tuple[int, Link]]:
        """For a collective over `axes` of `mesh`: per level, innermost first,
        how many of its group's devices that level joins (the product is
        the group's size; levels it does not cross are left out). A profile
        without levels (one device calibrated alone) crosses none: its
        collectives cost nothing."""
        unknown = [a for a in axes if a not in mesh]
        if unknown:
            raise PartirValueError(f"mesh axes {unknown} are not in the mesh {dict(mesh)}")
        if not self.levels:  # one device's profile, measured without links
            return []
        if math.prod(mesh.values()) > self.devices:
            raise PartirValueError(
                f"the mesh {dict(mesh)} has {math.prod(mesh.values())} devices; the profile "
                f"{self.name!r} has {self.devices}: pick a larger profile or a smaller mesh"
            )
        names = list(mesh)
        # The group's devices: the coordinates of `axes` vary, the others are 0.
        strides = {a: math.prod(mesh[b] for b in names[names.index(a) + 1 :]) for a in names}
        members = [0]
        for a in axes:
            members = [m + k * strides[a] for m in members for k in range(mesh[a])]
        found: list[tuple[int, Link]] = []
        span = 1  # devices per unit of the current level
        for level in self.levels:
            outer = span * level.size
            # distinct units of this level the group touches, per unit of the next
            inside = len({(m % outer) // span for m in members})
            if inside > 1:
                found.append((inside, level))
            span = outer
        return found

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_json(data: Mapping[str, Any]) -> Profile:
        try:
            return Profile(
                name=data["name"],
                device=Device(**data["device"]),
                levels=tuple(Link(**level) for level in data["levels"]),
                sources=tuple(data.get("sources", ())),
                platform=data.get("platform", ""),
            )
        except (KeyError, TypeError) as err:
            raise PartirValueError(f"not a partir device profile: {err}") from err

    def save(self, path: str | Path) -> Path:
        """Write the profile as JSON, readable only by the user."""
        return write_private(Path(path), json.dumps(self.to_json(), indent=2) + "\n")

    @staticmethod
    def load(path_or_name: str | Path) -> Profile:
        """A profile from a JSON file, or one of `named_profiles()` by name."""
        path = Path(path_or_name)
        if path.suffix != ".json" and str(path_or_name) in named_profiles():
            return named_profile(str(path_or_name))
        try:
            return Profile.from_json(json.loads(path.read_text()))
        except FileNotFoundError:
            raise PartirValueError(
                f"no profile file {str(path)!r}; the named profiles are {named_profiles()}"
            ) from None


def named_profiles() -> list[str]:
    """The profiles partir ships (`partir/cost/profiles/*.json`)."""
    folder = resources.files("partir.cost") / "profiles"
    names = (p.name for p in folder.iterdir())
    return sorted(n.removesuffix(".json") for n in names if n.endswith(".json"))


def named_profile(name: str) -> Profile:
    """A shipped profile by name (see `named_profiles`)."""
    if name not in named_profiles():
        raise PartirValueError(f"no named profile {name!r}; partir ships {named_profiles()}")
    text = (resources.files("partir.cost") / "profiles" / f"{name}.json").read_text()
    return Profile.from_json(json.loads(text))
