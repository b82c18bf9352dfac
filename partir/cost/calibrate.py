"""Measure this machine's profile: matmul throughput per element type,
memory bandwidth, the cost of a kernel, and each collective on each mesh
axis at several sizes, fitted to the α-β model the estimator uses
(`collective_costs`).

Every figure is the median of a few timed runs after a warm-up (compiles
are not timed), on work sized to the device (`Workload`): a GPU reaches its
rate only on large matmuls (8192³) and streams (1 GiB), where a CPU host
would take minutes. The devices JAX sees form one level (this host); the
collectives' α and β are one least-squares fit over every kind, axis and
size, each measurement normalised by the ring factors of its kind and group
size, so the fit answers "what α and β make the model match this machine".
On one device there is nothing to fit: the levels come from a named profile
(`links=`), or there are none, and the estimate then costs no
communication. The profile's `sources` say what was measured and how.
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

from dialects.errors import PartirValueError
from partir.cost.profile import Device, Link, Profile

SIZES = (1 << 14, 1 << 16, 1 << 18, 1 << 20, 1 << 22)
"""Bytes per device for each collective measurement."""

KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "collective_permute")


@dataclass(frozen=True)
class Workload:
    """How large the measurements are: the n of each n³ matmul (the fastest
    counts), the bytes of each operand of the streaming add, per device, and
    the bytes per device of each collective."""

    matmul_sizes: tuple[int, ...]
    stream_bytes: int
    collective_bytes: tuple[int, ...] = SIZES


ACCELERATOR = Workload((2048, 4096, 8192), 1 << 30, (*SIZES, 1 << 24, 1 << 26))
"""A GPU or TPU: matmuls up to 8192³ and 1 GiB streams reach the chip's rate."""

QUICK = Workload((64, 128), 1 << 20, (1 << 12, 1 << 16))
"""Seconds, not a minute: for tests and smoke runs (the figures are rough)."""


def workload_for(platform: str, devices: int) -> Workload:
    """The default `Workload` on `devices` devices of `platform`: CPU devices
    share the host's memory, so its stream (64 MiB per operand, past the
    caches) is split among them, and its matmuls stop at 512³."""
    if platform == "cpu":
        return Workload((128, 256, 512), (1 << 26) // devices)
    return ACCELERATOR


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


def _matmul_flops(jax_mesh: Any, sizes: tuple[int, ...], repeats: int, dtype: Any,
                  precision: Any = None) -> tuple[float, int]:
    """FLOP/s one device sustains on `dtype` matmuls while every device runs
    one (the best over `sizes`), at `precision` (None: JAX's default, which
    on a GPU runs f32 as TF32), and the n that gave it."""
    import jax.numpy as jnp

    best, best_n = 0.0, sizes[0]
    for n in sizes:
        a = jnp.full((n, n), 0.5, dtype)

        def matmul(a: Any) -> Any:
            return jnp.matmul(a, a, precision=precision)

        seconds = _median_seconds(_on_every_device(jax_mesh, matmul, a), repeats)
        if 2 * n**3 / seconds > best:
            best, best_n = 2 * n**3 / seconds, n
        del a
    return best, best_n


def _memory_bandwidth(jax_mesh: Any, stream_bytes: int, repeats: int) -> float:
    """Bytes/s one device streams through an f32 add of two `stream_bytes`
    operands into a third while every device runs one."""
    import jax.numpy as jnp

    n = max(stream_bytes // 4, 1)
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
    if not measurements:
        raise PartirValueError(
            f"no collective measurements to fit the link {name!r}: a mesh axis of more "
            "than one device is needed (or take the links of a named profile)"
        )
    rows, targets = [], []
    for m in measurements:
        steps, factor = _ring_factors(m.kind, m.devices)
        rows.append([steps / m.seconds, factor * m.nbytes / m.seconds])
        targets.append(1.0)
    (alpha, inverse_beta), *_ = np.linalg.lstsq(np.array(rows), np.array(targets), rcond=None)
    alpha = max(float(alpha), 1e-9)
    beta = 1 / max(float(inverse_beta), 1e-15)
    return Link(name, size, alpha, beta)


@dataclass(frozen=True)
class _DeviceFigures:
    """What `_measure_device` found, and how, for the profile's `sources`."""

    device: Device
    notes: tuple[str, ...]


def _measure_device(
    jax_mesh: Any, work: Workload, repeats: int, platform: str, bar: _Progress
) -> _DeviceFigures:
    """Matmul FLOP/s per element type, memory bandwidth and kernel overhead."""
    import jax
    import jax.numpy as jnp

    peaks: dict[str, float] = {}
    notes = []
    types: list[tuple[str, Any, Any]] = [("f32", jnp.float32, None), ("bf16", jnp.bfloat16, None)]
    if platform == "gpu":  # JAX's default runs f32 matmuls as TF32: the rate programs get
        types.append(("f32_highest", jnp.float32, jax.lax.Precision.HIGHEST))
    for key, dtype, precision in types:
        peaks[key], n = _matmul_flops(jax_mesh, work.matmul_sizes, repeats, dtype, precision)
        how = "Precision.HIGHEST (IEEE f32)" if precision else "JAX's default precision"
        if key == "f32" and platform == "gpu":
            how += " (TF32 on tensor cores where the GPU has them)"
        notes.append(
            f"matmul {key}: {peaks[key] / 1e12:.3f} TFLOP/s, best of n³ for n in "
            f"{list(work.matmul_sizes)} (at n={n}), {how}, median of {repeats}"
        )
        bar.step(f"matmul {key}")
    bandwidth = _memory_bandwidth(jax_mesh, work.stream_bytes, repeats)
    notes.append(
        f"memory: {bandwidth / 1e9:.2f} GB/s, f32 add of two {work.stream_bytes >> 20} MiB "
        f"operands per device (3 streams), median of {repeats}"
    )
    bar.step("memory bandwidth")
    overhead = _kernel_overhead(jax_mesh, repeats)
    notes.append(
        f"kernel overhead: {overhead * 1e6:.2f} µs, slope of time over chains of 8 and 64 "
        "unfusable 8x8 matmuls"
    )
    bar.step("kernel overhead")
    capacity = _memory_capacity(jax_mesh.devices.flat[0])
    return _DeviceFigures(Device(peaks, bandwidth, capacity, overhead), tuple(notes))


def _levels_of(links: str | Profile | None) -> tuple[Link, ...]:
    """The link levels of `links` (a profile or a named one), or none."""
    if links is None:
        return ()
    return (links if isinstance(links, Profile) else Profile.load(links)).levels


def calibrate(
    mesh: Mapping[str, int] | None = None,
    *,
    repeats: int = 5,
    save: bool | str | Path = True,
    progress: TextIO | None = sys.stderr,
    sizes: tuple[int, ...] | None = None,
    workload: Workload | None = None,
    links: str | Profile | None = None,
    name: str | None = None,
) -> Profile:
    """This machine's `Profile`, measured on `mesh` (default: one axis over
    every device JAX sees). The collectives over the mesh's axes of more
    than one device give the link level; where there are none (one device),
    the levels are `links`' (a profile or a shipped name, e.g. "h100-8"),
    or absent, and an estimate then costs no communication. `workload` sizes
    the measurements (default `workload_for` the platform; `QUICK` for a
    smoke run), `sizes` overrides its collective bytes. Saved as JSON (0600)
    in partir's private cache directory, or at `save` if it is a path; takes
    about a minute on the CPU host."""
    import jax

    from partir.api import devices_for
    from partir.mesh import Mesh

    devices = jax.devices()
    mesh = dict(mesh) if mesh is not None else {"devices": len(devices)}
    jax_mesh = devices_for(Mesh(mesh), None)
    platform = devices[0].platform
    work = workload or workload_for(platform, jax_mesh.size)
    collective_bytes = sizes or work.collective_bytes
    axes = [a for a in mesh if mesh[a] > 1]
    matmuls = 3 if platform == "gpu" else 2
    bar = _Progress(matmuls + 2 + len(KINDS) * len(collective_bytes) * len(axes), progress)
    figures = _measure_device(jax_mesh, work, repeats, platform, bar)
    measured = []
    for axis in axes:
        for kind in KINDS:
            for nbytes in collective_bytes:
                run, moved = _collective(kind, axis, jax_mesh, nbytes)
                seconds = _median_seconds(run, repeats)
                measured.append(Measurement(kind, axis, mesh[axis], moved, seconds))
                bar.step(f"{kind} over {axis}, {nbytes >> 10} KiB")
    if measured:
        levels: tuple[Link, ...] = (
            fit_link(measured, f"{platform} devices", jax_mesh.size),
        )
        link_note = (
            f"links: one level of {jax_mesh.size}, α-β fitted to {len(measured)} collective "
            f"measurements ({', '.join(KINDS)}; {len(collective_bytes)} sizes per axis)"
        )
    else:
        levels = _levels_of(links)
        link_note = (
            f"links: {len(levels)} level(s) taken from {getattr(links, 'name', links)!r}"
            if links is not None
            else "links: none (one device: no collective measured; estimates cost no "
            "communication)"
        )
    label = name or default_label(devices)
    profile = Profile(
        name=label,
        device=figures.device,
        levels=levels,
        sources=(
            f"partir.cost.calibrate on {platform} x{len(devices)} ({devices[0].device_kind}), "
            f"mesh {mesh}, {time.strftime('%Y-%m-%d %H:%M')}",
            *figures.notes,
            link_note,
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
