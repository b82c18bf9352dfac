"""Measure this machine's profile: matmul and elementwise throughput, the
cost of a kernel, and each collective on each mesh axis at several sizes,
fitted to the α-β model the estimator uses (`collective_costs`).

Every figure is the median of a few timed runs after a warm-up (compiles
are not timed). The devices JAX sees form one level (this host); the
collectives' α and β are one least-squares fit over every kind, axis and
size, each measurement normalised by the ring factors of its kind and group
size, so the fit answers "what α and β make the model match this machine".
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from partir.cost.profile import Device, Link, Profile

SIZES = (1 << 14, 1 << 16, 1 << 18, 1 << 20, 1 << 22)
"""Bytes per device for each collective measurement."""

KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "collective_permute")


@dataclass(frozen=True)
class Measurement:
    kind: str
    axis: str
    devices: int
    nbytes: int
    seconds: float


def _median_seconds(run: Callable[[], Any], repeats: int) -> float:
    run()  # compile and warm up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


class _Progress:
    def __init__(self, total: int, out: TextIO | None):
        self.total, self.done, self.out = total, 0, out

    def step(self, what: str) -> None:
        self.done += 1
        if self.out is None:
            return
        width = 30
        filled = width * self.done // self.total
        bar = "#" * filled + " " * (width - filled)
        self.out.write(f"\rcalibrating [{bar}] {self.done}/{self.total} {what:<40.40}")
        if self.done == self.total:
            self.out.write("\n")
        self.out.flush()


def _on_every_device(jax_mesh: Any, body: Callable[..., Any], *locals_: Any) -> Callable[[], Any]:
    """`body` run by every device at once on its own copy of `locals_` (as an
    SPMD program runs: the devices share the host's cores and memory)."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec

    spec = PartitionSpec(tuple(jax_mesh.axis_names))
    count = jax_mesh.size
    arrays = [
        jax.device_put(jnp.concatenate([x] * count), NamedSharding(jax_mesh, spec))
        for x in locals_
    ]
    f = jax.jit(jax.shard_map(body, mesh=jax_mesh, in_specs=spec, out_specs=spec))
    return lambda: f(*arrays).block_until_ready()


def _matmul_flops(jax_mesh: Any, repeats: int) -> float:
    """FLOP/s one device sustains on f32 matmuls while every device runs one."""
    import jax.numpy as jnp

    best = 0.0
    for n in (128, 256, 512):
        a = jnp.ones((n, n), jnp.float32)
        seconds = _median_seconds(_on_every_device(jax_mesh, lambda a: a @ a, a), repeats)
        best = max(best, 2 * n**3 / seconds)
    return best


def _memory_bandwidth(jax_mesh: Any, repeats: int) -> float:
    """Bytes/s one device streams through an add while every device runs one."""
    import jax.numpy as jnp

    n = (1 << 24) // jax_mesh.size  # 64 MiB per operand over all devices: past the caches
    x = jnp.ones(n, jnp.float32)
    seconds = _median_seconds(_on_every_device(jax_mesh, lambda x, y: x + y, x, x), repeats)
    return 3 * 4 * n / seconds


def _kernel_overhead(jax_mesh: Any, repeats: int) -> float:
    """The slope of time over a chain of k tiny unfusable ops (8x8 matmuls)."""
    import jax.numpy as jnp

    def chain(k: int) -> Callable[[Any], Any]:
        def run(a: Any) -> Any:
            for _ in range(k):
                a = jnp.tanh(a @ a)
            return a

        return run

    a = jnp.ones((8, 8), jnp.float32) * 0.01
    counts = (8, 64)
    times = [
        _median_seconds(_on_every_device(jax_mesh, chain(k), a), repeats) for k in counts
    ]
    return max((times[1] - times[0]) / (counts[1] - counts[0]), 0.0)


def _collective(
    kind: str, axis: str, jax_mesh: Any, nbytes: int
) -> tuple[Callable[[], Any], int]:
    """A run of `kind` over `axis` moving about `nbytes` per device, and the
    bytes it moves exactly (the larger of its input and output)."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec

    n = jax_mesh.shape[axis]
    per_device = max(nbytes // 4 // n * n, n)  # float32 elements, a multiple of n
    spec = PartitionSpec(tuple(jax_mesh.axis_names))
    devices = jax_mesh.size
    x = jax.device_put(
        jnp.ones((devices * per_device,), jnp.float32), NamedSharding(jax_mesh, spec)
    )
    perm = [(i, (i + 1) % n) for i in range(n)]
    bodies: dict[str, Callable[[Any], Any]] = {
        "all_reduce": lambda v: jax.lax.psum(v, axis),
        "all_gather": lambda v: jax.lax.all_gather(v[: per_device // n], axis, tiled=True),
        "reduce_scatter": lambda v: jax.lax.psum_scatter(v, axis, tiled=True),
        "all_to_all": lambda v: jax.lax.all_to_all(v, axis, 0, 0, tiled=True),
        "collective_permute": lambda v: jax.lax.ppermute(v, axis, perm),
    }
    body = bodies[kind]
    f = jax.jit(jax.shard_map(body, mesh=jax_mesh, in_specs=spec, out_specs=spec))
    return (lambda: f(x).block_until_ready()), 4 * per_device


def _ring_factors(kind: str, n: int) -> tuple[float, float]:
    """(latency steps, bandwidth factor) of `kind` on one level of n devices
    (`collective_costs.collective_seconds` with B = 1)."""
    if kind == "all_reduce":
        return 2 * (n - 1), 2 * (n - 1) / n
    if kind == "collective_permute":
        return 1, 1
    return n - 1, (n - 1) / n


def fit_link(measurements: list[Measurement], name: str, size: int) -> Link:
    """α and β minimising the squared relative error of the model over the
    measurements (each weighted by 1/seconds, so small and large sizes count
    alike)."""
    rows, targets = [], []
    for m in measurements:
        steps, factor = _ring_factors(m.kind, m.devices)
        rows.append([steps / m.seconds, factor * m.nbytes / m.seconds])
        targets.append(1.0)
    (alpha, inverse_beta), *_ = np.linalg.lstsq(np.array(rows), np.array(targets), rcond=None)
    alpha = max(float(alpha), 1e-9)
    beta = 1 / max(float(inverse_beta), 1e-15)
    return Link(name, size, alpha, beta)


def calibrate(
    mesh: Mapping[str, int] | None = None,
    *,
    repeats: int = 5,
    save: bool | str | Path = True,
    progress: TextIO | None = sys.stderr,
    sizes: tuple[int, ...] = SIZES,
    name: str | None = None,
) -> Profile:
    """This machine's `Profile`, measured on `mesh` (default: one axis over
    every device JAX sees). Saved as JSON (0600) in partir's private cache
    directory, or at `save` if it is a path; takes about a minute."""
    import jax

    from partir.api import devices_for
    from partir.mesh import Mesh

    devices = jax.devices()
    mesh = dict(mesh) if mesh is not None else {"devices": len(devices)}
    jax_mesh = devices_for(Mesh(mesh), None)
    steps = 3 + len(KINDS) * len(sizes) * sum(1 for a in mesh if mesh[a] > 1)
    bar = _Progress(steps, progress)
    flops = _matmul_flops(jax_mesh, repeats)
    bar.step("matmul")
    bandwidth = _memory_bandwidth(jax_mesh, repeats)
    bar.step("memory bandwidth")
    overhead = _kernel_overhead(jax_mesh, repeats)
    bar.step("kernel overhead")
    measured = []
    for axis, n in mesh.items():
        if n == 1:
            continue
        for kind in KINDS:
            for nbytes in sizes:
                run, moved = _collective(kind, axis, jax_mesh, nbytes)
                seconds = _median_seconds(run, repeats)
                measured.append(Measurement(kind, axis, n, moved, seconds))
                bar.step(f"{kind} over {axis}, {nbytes >> 10} KiB")
    platform = devices[0].platform
    capacity = _memory_capacity(devices[0])
    label = name or default_label(devices)
    profile = Profile(
        name=label,
        device=Device({"f32": flops}, bandwidth, capacity, overhead),
        levels=(fit_link(measured, f"{platform} devices", len(devices)),),
        sources=(
            f"partir.cost.calibrate on {platform} x{len(devices)}, mesh {mesh}, "
            f"{len(measured)} collective measurements, {time.strftime('%Y-%m-%d %H:%M')}",
        ),
    )
    if save:
        profile.save(_default_path(label) if save is True else Path(save))
    return profile


def _memory_capacity(device: Any) -> float:
    stats = getattr(device, "memory_stats", lambda: None)()
    if stats and stats.get("bytes_limit"):
        return float(stats["bytes_limit"])
    try:  # a CPU device shares the host's memory
        return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError):
        return float("inf")


def _default_path(label: str) -> Path:
    from partir.generated_files import cache_directory, private_directory

    folder = private_directory(cache_directory() / "profiles")
    if folder is None:
        raise OSError(f"cannot make a private profiles directory under {cache_directory()}")
    return folder / _file_name(label)


def default_label(devices: Any) -> str:
    """The name `calibrate` gives this machine's profile ("calibrated-cpu-8")."""
    return f"calibrated-{devices[0].platform}-{len(devices)}"


def _file_name(label: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in label) + ".json"


SHIPPED_FALLBACK = "cpu-host-8"
"""The shipped profile `machine_profile` falls back to: this project's 2-core
host with 8 virtual CPU devices, measured by `calibrate`."""


def machine_profile() -> tuple[Profile, str]:
    """This machine's profile as `calibrate()` saved it (mesh default, in the
    private cache), and a note saying which profile it is; where none is
    saved, the shipped `SHIPPED_FALLBACK`, and a note saying how to measure
    this machine instead (calibrating takes about a minute, so it is never
    done behind the caller's back)."""
    import jax

    from partir.generated_files import cache_directory

    path = cache_directory() / "profiles" / _file_name(default_label(jax.devices()))
    if path.is_file() and not path.is_symlink() and path.stat().st_uid == os.getuid():
        return Profile.load(path), f"this machine's calibrated profile ({path})"
    note = (
        f"no calibrated profile of this machine in {path.parent}; using the shipped "
        f"{SHIPPED_FALLBACK!r} (run partir.calibrate() once, about a minute, to measure "
        "this one)"
    )
    return Profile.load(SHIPPED_FALLBACK), note
