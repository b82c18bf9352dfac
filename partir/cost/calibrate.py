"""Measure this machine's profile: matmul throughput per element type,
memory bandwidth, the rate of a transposed read by size, the cost of a
kernel, and each collective on each mesh
axis at several sizes, fitted to the α-β model the estimator uses
(`collective_costs`).

Every figure is the median of a few timed runs after a warm-up (compiles
are not timed), on work sized to the device (`Workload`): a GPU reaches its
rate only on large matmuls (8192³) and streams (1 GiB), where a CPU host
would take minutes. The devices JAX sees form one level (this host), whose
collectives run as rings (GPU, TPU) or through shared memory (CPU devices,
`profile.SHARED_MEMORY`); each kind gets its own α and β, a least-squares
fit over its axes and sizes, each measurement normalised by its kind's
factors for its group size (`collective_costs.factors`), so the fit answers
"what α and β make the model match this machine" per kind (the link's own
α and β are the fit over every kind). On one device there is nothing to
fit: the levels come from a named profile (`links=`), or there are none, and
the estimate then costs no communication. The profile's `sources` say what
was measured and how.

What is timed is a list of `Probe`s (`calibration_probes`) and the profile
their fit (`fit_profile`): `calibrate` times each alone, a benchmark may
time them among its own programs so both see the same load
(`benchmarks/simulator.py`).
"""

from __future__ import annotations

import math
import os
import statistics
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from dialects.errors import PartirValueError
from lowering.collective_probes import probe as collective_probe
from partir.cost.collective_costs import KINDS, factors
from partir.cost.machine import default_label, default_path
from partir.cost.profile import RING, SHARED_MEMORY, Device, Link, Profile
from partir.devices import devices_for
from partir.mesh import Mesh

SIZES = (1 << 14, 1 << 16, 1 << 18, 1 << 20, 1 << 22)
"""Bytes per device for each collective measurement."""


@dataclass(frozen=True)
class Workload:
    """How large the measurements are: the n of each n³ matmul (the fastest
    counts), the smallest dimensions of the f32 matmuls that say how the rate
    falls with it (each `matmul_width` x d x `matmul_width`), the bytes of
    each operand of the streaming add, per device, and the bytes per device
    of each collective."""

    matmul_sizes: tuple[int, ...]
    stream_bytes: int
    collective_bytes: tuple[int, ...] = SIZES
    matmul_dims: tuple[int, ...] = ()
    matmul_width: int = 0

    @property
    def transposed_bytes(self) -> tuple[int, ...]:
        """The sizes of the transposed reads measured: a sixteenth, a quarter
        and all of the stream's operand (in the caches and past them)."""
        return (self.stream_bytes >> 4, self.stream_bytes >> 2, self.stream_bytes)


ACCELERATOR = Workload(
    (2048, 4096, 8192), 1 << 30, (*SIZES, 1 << 24, 1 << 26), (64, 256, 1024), 8192
)
"""A GPU or TPU: matmuls up to 8192³ and 1 GiB streams reach the chip's rate."""

QUICK = Workload((64, 128), 1 << 20, (1 << 12, 1 << 16), (8, 32), 128)
"""Seconds, not a minute: for tests and smoke runs (the figures are rough)."""


def workload_for(platform: str, devices: int) -> Workload:
    """The default `Workload` on `devices` devices of `platform`: CPU devices
    share the host's memory, so its stream (64 MiB per operand, past the
    caches) is split among them, and its matmuls stop at 512³."""
    if platform == "cpu":
        return Workload((128, 256, 512), (1 << 26) // devices, SIZES, (16, 32, 64, 128, 256), 1024)
    return ACCELERATOR


@dataclass(frozen=True)
class Measurement:
    kind: str
    axis: str
    devices: int
    nbytes: int
    seconds: float


MIN_SECONDS = 0.05
"""How long one timing of a probe lasts at least: a probe faster than that
runs back to back until it does (`batched`). On a host shared with other
work, a burst of a few milliseconds gets the cores a step of hundreds does
not; timed this long, probes and programs see the same share."""


def batched(
    run: Callable[[], Any], min_seconds: float = MIN_SECONDS
) -> tuple[Callable[[], None], int]:
    """`run` (compiled and warmed up here) repeated back to back k times, k
    such that the whole lasts about `min_seconds`; and k (divide a timing
    of the whole by it)."""
    run()  # compile and warm up
    start = time.perf_counter()
    run()
    once = max(time.perf_counter() - start, 1e-7)
    k = max(1, math.ceil(min_seconds / once))

    def many() -> None:
        for _ in range(k):
            run()

    return many, k


def _median_seconds(run: Callable[[], Any], repeats: int) -> float:
    """The median over `repeats` timings of one run of `run` (`batched`)."""
    many, k = batched(run)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        many()
        times.append((time.perf_counter() - start) / k)
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
    spec = PartitionSpec(tuple(jax_mesh.axis_names))
    count = jax_mesh.size
    arrays = [
        jax.device_put(jnp.concatenate([x] * count), NamedSharding(jax_mesh, spec))
        for x in locals_
    ]
    f = jax.jit(jax.shard_map(body, mesh=jax_mesh, in_specs=spec, out_specs=spec))
    return lambda: f(*arrays).block_until_ready()


def _matmul(
    shape: tuple[int, int, int], dtype: Any, precision: Any
) -> Callable[[Any], Callable[[], Any]]:
    """An (m, k) x (k, n) `dtype` matmul at `precision` (None: JAX's default,
    which on a GPU runs f32 as TF32), every device running one."""
    m, k, n = shape

    def build(jax_mesh: Any) -> Callable[[], Any]:
        def matmul(a: Any, b: Any) -> Any:
            return jnp.matmul(a, b, precision=precision)

        a, b = jnp.full((m, k), 0.5, dtype), jnp.full((k, n), 0.5, dtype)
        return _on_every_device(jax_mesh, matmul, a, b)

    return build


def _stream(stream_bytes: int) -> Callable[[Any], Callable[[], Any]]:
    """An f32 add of two `stream_bytes` operands into a third, every device running one."""

    def build(jax_mesh: Any) -> Callable[[], Any]:
        x = jnp.ones(max(stream_bytes // 4, 1), jnp.float32)
        return _on_every_device(jax_mesh, lambda x, y: x + y, x, x)

    return build


def transposed_shape(nbytes: int) -> tuple[int, int]:
    """The f32 matrix of the transposed-read probe of about `nbytes`:
    power-of-two sides (as a layer's weights), the rows the longer."""
    exponent = max(int(math.log2(max(nbytes // 4, 1))), 0)
    return 1 << (exponent - exponent // 2), 1 << (exponent // 2)


def _transposed(rows: int, cols: int) -> Callable[[Any], Callable[[], Any]]:
    """2 x the transpose of a rows x cols f32 matrix, every device running
    one: XLA fuses the transpose into the multiply, whose kernel reads it in
    the other order (as an update reads a gradient the backward pass made
    transposed)."""

    def build(jax_mesh: Any) -> Callable[[], Any]:
        x = jnp.ones((rows, cols), jnp.float32)
        return _on_every_device(jax_mesh, lambda x: 2 * x.T, x)

    return build


CHAIN = (8, 64)
"""The lengths of the chains of tiny unfusable ops whose slope is the kernel overhead."""

KERNELS_PER_LINK = 2
"""Kernels per link of the chain as the estimator counts them: the 8x8
matmul and the tanh, which feeds the next matmul and so is not fused."""


def _chain(k: int) -> Callable[[Any], Callable[[], Any]]:
    """k links of `tanh(a @ a)` on an 8x8 matrix, every device running one."""

    def build(jax_mesh: Any) -> Callable[[], Any]:
        def run(a: Any) -> Any:
            for _ in range(k):
                a = jnp.tanh(a @ a)
            return a

        return _on_every_device(jax_mesh, run, jnp.ones((8, 8), jnp.float32) * 0.01)

    return build


@dataclass(frozen=True)
class Probe:
    """One timed measurement of a calibration: a label, what it measures
    (`what`: "matmul", "memory", "transposed", "chain" or a collective
    kind) with the figures its fit needs, and how to build its run on a JAX
    mesh (the run blocks until its result is ready)."""

    label: str
    what: str
    build: Callable[[Any], Callable[[], Any]]
    shape: tuple[int, ...] = ()
    """A matmul's (m, k, n); a transposed read's matrix."""
    key: str = ""
    """The element type of a matmul; the mesh axis of a collective."""
    size: int = 0
    """A stream's bytes per operand, a transposed read's bytes, a chain's
    length, a collective's bytes per device (the larger of its input and
    output)."""
    devices: int = 1
    """A collective's group size."""


def calibration_probes(
    mesh: Mapping[str, int], platform: str, work: Workload,
    collective_bytes: tuple[int, ...] | None = None,
) -> list[Probe]:
    """What `calibrate` times on `mesh` of `platform` devices, sized by `work`."""
    types: list[tuple[str, Any, Any]] = [("f32", "float32", None), ("bf16", "bfloat16", None)]
    if platform == "gpu":  # JAX's default runs f32 matmuls as TF32: the rate programs get
        types.append(("f32_highest", "float32", "highest"))
    probes = [
        Probe(f"matmul {key} {n}³", "matmul", _matmul((n, n, n), dtype, precision), (n, n, n), key)
        for key, dtype, precision in types
        for n in work.matmul_sizes
    ]
    w = work.matmul_width
    probes += [
        Probe(f"matmul f32 {w}x{d}x{w}", "matmul", _matmul((w, d, w), "float32", None),
              (w, d, w), "f32")
        for d in work.matmul_dims
    ]
    probes.append(Probe("memory bandwidth", "memory", _stream(work.stream_bytes),
                        size=work.stream_bytes))
    for rows, cols in map(transposed_shape, work.transposed_bytes):
        probes.append(Probe(f"transposed read {rows}x{cols}", "transposed",
                            _transposed(rows, cols), (rows, cols), size=4 * rows * cols))
    probes += [Probe(f"kernel chain of {k}", "chain", _chain(k), size=k) for k in CHAIN]
    for axis in (a for a in mesh if mesh[a] > 1):
        n = mesh[axis]
        for kind in KINDS:
            for nbytes in collective_bytes or work.collective_bytes:
                per_device = max(nbytes // 4 // n * n, n)
                probes.append(Probe(
                    f"{kind} over {axis}, {nbytes >> 10} KiB", kind,
                    collective_probe(kind, axis, per_device), key=axis, size=4 * per_device,
                    devices=n,
                ))
    return probes


def algorithm_for(platform: str) -> str:
    """How `platform`'s devices run collectives: XLA's CPU devices are
    threads of one process (`SHARED_MEMORY`), others rings over links."""
    return SHARED_MEMORY if platform == "cpu" else RING


def _fit_alpha_beta(measurements: list[Measurement], algorithm: str) -> tuple[float, float]:
    """α and β minimising the squared relative error of the model over the
    measurements (each weighted by 1/seconds, so small and large sizes count
    alike)."""
    rows, targets = [], []
    for m in measurements:
        steps, factor = factors(m.kind, m.devices, algorithm)
        rows.append([steps / m.seconds, factor * m.nbytes / m.seconds])
        targets.append(1.0)
    (alpha, inverse_beta), *_ = np.linalg.lstsq(np.array(rows), np.array(targets), rcond=None)
    return max(float(alpha), 1e-9), 1 / max(float(inverse_beta), 1e-15)


def fit_link(
    measurements: list[Measurement], name: str, size: int, algorithm: str = RING
) -> Link:
    """The link level the measurements describe: α and β per kind (a kind
    measured at two sizes or more) and over every kind (the link's own)."""
    if not measurements:
        raise PartirValueError(
            f"no collective measurements to fit the link {name!r}: a mesh axis of more "
            "than one device is needed (or take the links of a named profile)"
        )
    alpha, beta = _fit_alpha_beta(measurements, algorithm)
    per_kind = {}
    for kind in KINDS:
        mine = [m for m in measurements if m.kind == kind]
        if len({m.nbytes for m in mine}) >= 2:
            per_kind[kind] = _fit_alpha_beta(mine, algorithm)
    return Link(name, size, alpha, beta, algorithm, per_kind)


def fit_profile(
    timed: list[tuple[Probe, float]],
    *,
    mesh: Mapping[str, int],
    devices: Any,
    how: str,
    links: str | Profile | None = None,
    name: str | None = None,
) -> Profile:
    """The profile the `timed` probes (each with its seconds) describe, on
    `mesh` of JAX `devices`; `how` says how each was timed (the sources)."""
    platform = devices[0].platform
    peaks: dict[str, float] = {}
    notes = []
    chains = {p.size: s for p, s in timed if p.what == "chain"}
    (short, long) = sorted(chains)
    slope = max((chains[long] - chains[short]) / (long - short), 0.0)
    overhead = slope / KERNELS_PER_LINK
    call = max(chains[short] - short * slope, 0.0)
    notes.append(
        f"kernel overhead: {overhead * 1e6:.2f} µs, slope of time over chains of {short} and "
        f"{long} links of an 8x8 matmul and a tanh ({KERNELS_PER_LINK} kernels a link); "
        f"a call's own cost, the chains' intercept ({call * 1e6:.0f} µs), taken off every "
        f"other probe's time (a program's op pays no call), {how}"
    )
    # a matmul the call's cost dominates (half its time or more) gives no peak: the
    # difference of two close timings on a loaded host can make it look arbitrarily fast
    slow = {id(p) for p, s in timed if s >= 2 * call}
    # what the op took: the probe's time less the call's (never below 1% of it)
    timed = [(p, s if p.what == "chain" else max(s - call, s / 100)) for p, s in timed]
    matmuls = [(p, 2 * math.prod(p.shape) / s) for p, s in timed if p.what == "matmul"]
    long_matmuls = [(p, rate) for p, rate in matmuls if id(p) in slow]
    for key in dict.fromkeys(p.key for p, _ in matmuls):
        rates = {p.shape: rate for p, rate in long_matmuls if p.key == key} or {
            p.shape: rate for p, rate in matmuls if p.key == key
        }
        best = max(rates, key=rates.__getitem__)
        peaks[key] = rates[best]
        precision = "JAX's default precision"
        if key == "f32_highest":
            precision = "Precision.HIGHEST (IEEE f32)"
        if key == "f32" and platform == "gpu":
            precision += " (TF32 on tensor cores where the GPU has them)"
        notes.append(
            f"matmul {key}: {peaks[key] / 1e12:.3f} TFLOP/s, best of "
            f"{sorted('x'.join(map(str, shape)) for shape in rates)} (at "
            f"{'x'.join(map(str, best))}), {precision}, {how}"
        )
    shaped = [(p, rate) for p, rate in matmuls if p.key == "f32" and len(set(p.shape)) > 1]
    efficiency = tuple((min(p.shape), rate / peaks["f32"]) for p, rate in shaped)
    if shaped:
        notes.append(
            "matmul efficiency by smallest dimension: "
            + ", ".join(f"{d}: {f:.0%}" for d, f in sorted(efficiency))
            + f" of the f32 peak (f32 matmuls {', '.join(p.label.split()[-1] for p, _ in shaped)})"
            + f", {how}"
        )
    ((stream, stream_seconds),) = [(p, s) for p, s in timed if p.what == "memory"]
    bandwidth = 3 * 4 * max(stream.size // 4, 1) / stream_seconds
    notes.append(
        f"memory: {bandwidth / 1e9:.2f} GB/s, f32 add of two {stream.size >> 20} MiB "
        f"operands per device (3 streams), {how}"
    )
    transposed = []
    for p, s in timed:
        if p.what == "transposed":  # its write streams; the rest is the strided read
            strided = s - p.size / bandwidth
            # never above the streaming rate: where the read took less than a
            # stream (a loaded host timing the stream slow), the rate is the
            # bandwidth itself (size / (size / bandwidth) rounds past it)
            rate = p.size / strided if strided > p.size / bandwidth else bandwidth
            transposed.append((p.size, rate))
    if transposed:
        notes.append(
            "transposed reads: "
            + ", ".join(f"{b >> 10} KiB: {r / 1e9:.2f} GB/s" for b, r in sorted(transposed))
            + " (2 x a 2-D f32 transpose, XLA's fusion reading it in the other order; the time "
            f"less its write at the memory bandwidth), {how}"
        )
    measured = [
        Measurement(p.what, p.key, p.devices, p.size, s) for p, s in timed if p.what in KINDS
    ]
    count = math.prod(mesh.values())
    if measured:
        algorithm = algorithm_for(platform)
        levels: tuple[Link, ...] = (fit_link(measured, f"{platform} devices", count, algorithm),)
        axes = sorted({m.axis for m in measured})
        link_note = (
            f"links: one level of {count} ({algorithm}), α-β fitted per kind to "
            f"{len(measured)} collective measurements ({', '.join(KINDS)}; "
            f"{len({m.nbytes for m in measured})} sizes over {axes}), {how}"
        )
    else:
        levels = _levels_of(links)
        link_note = (
            f"links: {len(levels)} level(s) taken from {getattr(links, 'name', links)!r}"
            if links is not None
            else "links: none (one device: no collective measured; estimates cost no "
            "communication)"
        )
    capacity = _memory_capacity(devices[0])
    return Profile(
        name=name or default_label(devices),
        device=Device(peaks, bandwidth, capacity, overhead, efficiency, tuple(transposed)),
        levels=levels,
        sources=(
            f"partir.cost.calibrate on {platform} x{len(devices)} ({devices[0].device_kind}), "
            f"mesh {dict(mesh)}, {time.strftime('%Y-%m-%d %H:%M')}",
            *notes,
            link_note,
        ),
        platform=platform,
    )


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
    devices = jax.devices()
    mesh = dict(mesh) if mesh is not None else {"devices": len(devices)}
    jax_mesh = devices_for(Mesh(mesh), None)
    platform = devices[0].platform
    work = workload or workload_for(platform, jax_mesh.size)
    probes = calibration_probes(mesh, platform, work, sizes)
    bar = _Progress(len(probes), progress)
    timed = []
    for probe in probes:  # one at a time: an accelerator's probes are large
        timed.append((probe, _median_seconds(probe.build(jax_mesh), repeats)))
        bar.step(probe.label)
    profile = fit_profile(
        timed, mesh=mesh, devices=devices,
        how=f"median of {repeats} timings of at least {MIN_SECONDS} s each",
        links=links, name=name,
    )
    if save:
        profile.save(default_path(profile.name) if save is True else Path(save))
    return profile


def _memory_capacity(device: Any) -> float:
    stats = getattr(device, "memory_stats", lambda: None)()
    if stats and stats.get("bytes_limit"):
        return float(stats["bytes_limit"])
    try:  # a CPU device shares the host's memory
        return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError):
        return float("inf")
