"""Random JAX programs, tactics and meshes: the fuzzer's grammar as hypothesis strategies.

A program is straight-line JAX source over float32 inputs (and int32 index
inputs for `take`), built op by op while tracking every value's shape, so each
op is drawn only where it type-checks. Dims are drawn from sizes the mesh axes
divide and from sizes they do not, so tactics hit both the partitioning and the
refusal paths. A case is rendered as Python source (`Case.script`) that replays
it outside hypothesis.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from hypothesis import strategies as st

MESHES: tuple[dict[str, int], ...] = (
    {"x": 8},
    {"a": 2, "b": 4},
    {"a": 2, "b": 2, "c": 2},
    {"a": 4, "b": 2},
)

ODD_SIZES = (3, 1, 6, 5, 12)
"""Dim sizes that some or all mesh axes do not divide (drawn about one time in 6)."""


def dim_sizes(mesh: dict[str, int]) -> tuple[int, ...]:
    """Dim sizes every tiling by one or two of `mesh`'s axes can divide."""
    sizes = {n * k for n in mesh.values() for k in (1, 2)}
    sizes |= {m * n for m in mesh.values() for n in mesh.values() if m * n <= 16}
    return tuple(sorted(sizes))

MAX_ELEMENTS = 4096
MAX_RANK = 4

UNARY = {
    "neg": "-{x}",
    "abs": "jnp.abs({x})",
    "tanh": "jnp.tanh({x})",
    "sin": "jnp.sin({x})",
    "cos": "jnp.cos({x})",
    "exp": "jnp.exp({x})",
    "log1p_abs": "jnp.log1p(jnp.abs({x}))",
    "sqrt": "jnp.sqrt(jnp.abs({x}) + 1.0)",
    "sigmoid": "jax.nn.sigmoid({x})",
    "relu": "jax.nn.relu({x})",
    "square": "{x} * {x}",
    "scale": "{x} * 0.5 + 0.25",
}

BINARY = {
    "add": "{x} + {y}",
    "sub": "{x} - {y}",
    "mul": "{x} * {y}",
    "div": "{x} / (1.0 + {y} * {y})",
    "maximum": "jnp.maximum({x}, {y})",
    "minimum": "jnp.minimum({x}, {y})",
    "where": "jnp.where({x} > {y}, {x}, {y} * 0.5)",
}

REDUCTIONS = ("sum", "mean", "max", "min")


@dataclass(frozen=True)
class Input:
    """A function parameter: float32 data, or int32 indices in `[0, bound)`."""

    name: str
    shape: tuple[int, ...]
    bound: int | None = None

    @property
    def is_index(self) -> bool:
        return self.bound is not None


@dataclass(frozen=True)
class Program:
    """Straight-line JAX: `lines` define `v0, v1, ...`; `outputs` are returned.

    In "grad" / "value_and_grad" mode the outputs feed a scalar `loss` and the
    function is its gradient with respect to every float input.
    """

    inputs: tuple[Input, ...]
    lines: tuple[str, ...]
    outputs: tuple[tuple[str, tuple[int, ...]], ...]
    mode: str = "forward"
    loss: str = ""

    @property
    def argnums(self) -> tuple[int, ...]:
        return tuple(i for i, x in enumerate(self.inputs) if not x.is_index)

    def source(self) -> str:
        params = ", ".join(x.name for x in self.inputs)
        head = "f" if self.mode == "forward" else "loss"
        body = [f"def {head}({params}):", *(f"    {line}" for line in self.lines)]
        if self.mode == "forward":
            body.append(f"    return ({''.join(name + ', ' for name, _ in self.outputs)})")
            return "\n".join(body) + "\n"
        body.append(f"    return {self.loss}")
        transform = "jax.grad" if self.mode == "grad" else "jax.value_and_grad"
        return "\n".join(body) + f"\n\n\nf = {transform}(loss, argnums={self.argnums!r})\n"

    def results(self) -> list[tuple[str, tuple[int, ...]]]:
        """Each result leaf's selector name (`result/...`) and shape."""
        if self.mode == "forward":
            return [(f"result/{i}", shape) for i, (_, shape) in enumerate(self.outputs)]
        grads = [self.inputs[i].shape for i in self.argnums]
        if self.mode == "grad":
            return [(f"result/{k}", s) for k, s in enumerate(grads)]
        return [("result/0", ()), *((f"result/1/{k}", s) for k, s in enumerate(grads))]


@dataclass(frozen=True)
class TacticSpec:
    """A tactic as data: `kind` is "ManualPartition" or "BatchParallel"."""

    kind: str
    spec: tuple[tuple[str, tuple[tuple[int, str], ...]], ...] = ()
    axis: str = ""
    inputs: str | None = None

    def source(self) -> str:
        if self.kind == "BatchParallel":
            extra = f", inputs={self.inputs!r}" if self.inputs is not None else ""
            return f"partir.BatchParallel({self.axis!r}{extra})"
        table = ", ".join(
            f"{name!r}: {{{', '.join(f'{d}: {a!r}' for d, a in dims)}}}" for name, dims in self.spec
        )
        return f"partir.ManualPartition({{{table}}})"


@dataclass(frozen=True)
class Case:
    """One fuzz case: a program, a mesh, a schedule of tactics and the data seed."""

    program: Program
    mesh: dict[str, int]
    tactics: tuple[TacticSpec, ...]
    data_seed: int
    spmd_every: int = 8

    @property
    def check_spmd(self) -> bool:
        """Whether the SPMD stage also runs on the NumPy interpreter: for one
        case in `spmd_every`, picked by a hash of the case (so hypothesis's
        preference for small draws does not skew it, and a replay agrees)."""
        text = f"{self.program.source()}{self.mesh}{self.tactics_source()}{self.data_seed}"
        digest = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")
        return self.spmd_every > 0 and digest % self.spmd_every == 0

    def tactics_source(self) -> str:
        return "[" + ", ".join(t.source() for t in self.tactics) + "]"

    def inputs_source(self) -> str:
        return repr([(x.shape, x.bound) for x in self.program.inputs])

    def script(self) -> str:
        """Python that replays this case from the repository root (paste it into a file)."""
        return (
            "import jax\nimport jax.numpy as jnp\n\nimport partir\n"
            "from tests.fuzz.oracle import make_args, run_program\n\n\n"
            f"{self.program.source()}\n\n"
            f"mesh = partir.Mesh({self.mesh!r})\n"
            f"tactics = {self.tactics_source()}\n"
            f"args = make_args({self.data_seed}, {self.inputs_source()})\n"
            f"print(run_program(f, args, mesh, tactics, check_spmd={self.check_spmd}))\n"
        )


@dataclass
class _Builder:
    """The program under construction: values by name with their shapes."""

    draw: Callable
    sizes: tuple[int, ...]
    inputs: list[Input] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)
    values: dict[str, tuple[int, ...]] = field(default_factory=dict)

    def new_input(self, shape: tuple[int, ...], bound: int | None = None) -> str:
        name = f"{'i' if bound is not None else 'a'}{len(self.inputs)}"
        self.inputs.append(Input(name, shape, bound))
        if bound is None:
            self.values[name] = shape
        return name

    def emit(self, expr: str, shape: tuple[int, ...]) -> str:
        name = f"v{len(self.lines)}"
        self.lines.append(f"{name} = {expr}")
        self.values[name] = shape
        return name

    def operand(self) -> str:
        return self.draw(st.sampled_from(sorted(self.values, key=_value_order)))

    def partner(self, shape: tuple[int, ...]) -> str:
        """A float value of exactly `shape`: an existing one, or a new input."""
        same = sorted((n for n, s in self.values.items() if s == shape), key=_value_order)
        if same and self.draw(st.booleans()):
            return self.draw(st.sampled_from(same))
        return self.new_input(shape)

    def dim(self) -> int:
        if self.draw(st.integers(0, 5)) == 5:
            return self.draw(st.sampled_from(ODD_SIZES))
        return self.draw(st.sampled_from(self.sizes))


def _value_order(name: str) -> tuple[int, int]:
    """Latest values first (so shrinking prefers chains), inputs last."""
    return (name[0] != "v", -int(name[1:]))


def _fits(shape: tuple[int, ...]) -> bool:
    return len(shape) <= MAX_RANK and math.prod(shape) <= MAX_ELEMENTS


def _unary(b: _Builder, x: str) -> None:
    op = b.draw(st.sampled_from(sorted(UNARY)))
    b.emit(UNARY[op].format(x=x), b.values[x])


def _binary(b: _Builder, x: str) -> None:
    shape = b.values[x]
    op = b.draw(st.sampled_from(sorted(BINARY)))
    form = b.draw(st.sampled_from(("same", "broadcast", "scalar")))
    if form == "scalar":
        b.emit(BINARY[op].format(x=x, y="1.5"), shape)
        return
    other = shape
    if form == "broadcast" and shape:
        keep = b.draw(st.integers(0, len(shape)))  # drop leading dims, set some to 1
        other = tuple(
            1 if b.draw(st.booleans()) else d for d in shape[len(shape) - keep :]
        )
    y = b.partner(other)
    if b.draw(st.booleans()):
        x, y = y, x
    b.emit(BINARY[op].format(x=x, y=y), shape)


def _einsum(b: _Builder, x: str) -> None:
    shape = b.values[x]
    letters = iter("abcdefghijklmnop")
    roles = [b.draw(st.sampled_from(("batch", "contract", "free"))) for _ in shape]
    xs = [next(letters) for _ in shape]
    batch = [(ch, d) for ch, d, r in zip(xs, shape, roles, strict=True) if r == "batch"]
    contract = [(ch, d) for ch, d, r in zip(xs, shape, roles, strict=True) if r == "contract"]
    free_x = [(ch, d) for ch, d, r in zip(xs, shape, roles, strict=True) if r == "free"]
    free_y = [(next(letters), b.dim()) for _ in range(b.draw(st.integers(0, 2)))]
    y_dims = batch + contract + free_y
    y_dims = b.draw(st.permutations(y_dims)) if y_dims else y_dims
    out = batch + free_x + free_y
    out_shape = tuple(d for _, d in out)
    if not _fits(out_shape) or not y_dims:
        return
    y = b.partner(tuple(d for _, d in y_dims))
    spec = f"{''.join(xs)},{''.join(ch for ch, _ in y_dims)}->{''.join(ch for ch, _ in out)}"
    b.emit(f"jnp.einsum({spec!r}, {x}, {y})", out_shape)


def _matmul(b: _Builder, x: str) -> None:
    shape = b.values[x]
    if len(shape) < 2:
        return
    n = b.dim()
    y_shape = (*shape[:-2], shape[-1], n)
    out = (*shape[:-1], n)
    if _fits(out):
        b.emit(f"{x} @ {b.partner(y_shape)}", out)


def _reduce(b: _Builder, x: str) -> None:
    shape = b.values[x]
    op = b.draw(st.sampled_from(REDUCTIONS))
    keepdims = b.draw(st.booleans())
    if not shape or b.draw(st.integers(0, 4)) == 0:
        axes = tuple(range(len(shape)))
        axis = "None"
    else:
        axes = tuple(sorted(b.draw(st.sets(st.integers(0, len(shape) - 1), min_size=1))))
        axis = repr(axes)
    out = tuple(
        1 if i in axes else d for i, d in enumerate(shape) if keepdims or i not in axes
    )
    b.emit(f"jnp.{op}({x}, axis={axis}, keepdims={keepdims})", out)


def _broadcast(b: _Builder, x: str) -> None:
    shape = b.values[x]
    if b.draw(st.booleans()):
        k = b.draw(st.integers(0, len(shape)))
        out = (*shape[:k], 1, *shape[k:])
        if _fits(out):
            b.emit(f"jnp.expand_dims({x}, {k})", out)
        return
    lead = tuple(b.dim() for _ in range(b.draw(st.integers(0, 2))))
    out = (*lead, *(b.dim() if d == 1 else d for d in shape))
    if _fits(out) and out != shape:
        b.emit(f"jnp.broadcast_to({x}, {out!r})", out)


def _factors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _reshape(b: _Builder, x: str) -> None:
    shape = b.values[x]
    size = math.prod(shape)
    out: list[int] = []
    rest = size
    for _ in range(b.draw(st.integers(0, 3))):
        d = b.draw(st.sampled_from(_factors(rest)))
        out.append(d)
        rest //= d
    out.append(rest)
    out = b.draw(st.permutations(out))
    b.emit(f"jnp.reshape({x}, {tuple(out)!r})", tuple(out))


def _transpose(b: _Builder, x: str) -> None:
    shape = b.values[x]
    if len(shape) < 2:
        return
    perm = tuple(b.draw(st.permutations(range(len(shape)))))
    b.emit(f"jnp.transpose({x}, {perm!r})", tuple(shape[p] for p in perm))


def _concatenate(b: _Builder, x: str) -> None:
    shape = b.values[x]
    if not shape:
        return
    k = b.draw(st.integers(0, len(shape) - 1))
    other = (*shape[:k], b.dim(), *shape[k + 1 :])
    out = (*shape[:k], shape[k] + other[k], *shape[k + 1 :])
    if _fits(out):
        y = b.partner(other)
        b.emit(f"jnp.concatenate([{x}, {y}], axis={k})", out)


def _slice(b: _Builder, x: str) -> None:
    shape = b.values[x]
    if not shape:
        return
    parts, out = [], []
    for d in shape:
        kind = b.draw(st.sampled_from(("all", "range", "stride", "index", "reverse")))
        if kind == "index":
            parts.append(str(b.draw(st.integers(-d, d - 1))))
            continue
        if kind == "all" or (kind == "range" and d < 2):
            parts.append(":")
            out.append(d)
        elif kind == "reverse":
            parts.append("::-1")
            out.append(d)
        else:
            start = b.draw(st.integers(0, d - 1))
            stop = b.draw(st.integers(start + 1, d))
            step = b.draw(st.integers(1, 3)) if kind == "stride" else 1
            parts.append(f"{start}:{stop}" + (f":{step}" if step > 1 else ""))
            out.append(len(range(start, stop, step)))
    b.emit(f"{x}[{', '.join(parts)}]", tuple(out))


def _softmax(b: _Builder, x: str) -> None:
    shape = b.values[x]
    if not shape:
        return
    fn = b.draw(st.sampled_from(("softmax", "log_softmax")))
    k = b.draw(st.integers(-len(shape), len(shape) - 1))
    b.emit(f"jax.nn.{fn}({x}, axis={k})", shape)


def _take(b: _Builder, x: str) -> None:
    shape = b.values[x]
    if not shape:
        return
    k = b.draw(st.integers(0, len(shape) - 1))
    if b.draw(st.booleans()):
        idx_shape = tuple(b.dim() for _ in range(b.draw(st.integers(1, 2))))
        out = (*shape[:k], *idx_shape, *shape[k + 1 :])
        if _fits(out):
            i = b.new_input(idx_shape, bound=shape[k])
            b.emit(f"jnp.take({x}, {i}, axis={k})", out)
        return
    idx_shape = (*shape[:k], b.dim(), *shape[k + 1 :])
    if _fits(idx_shape):
        i = b.new_input(idx_shape, bound=shape[k])
        b.emit(f"jnp.take_along_axis({x}, {i}, axis={k})", idx_shape)


OPS = {
    "unary": _unary,
    "binary": _binary,
    "einsum": _einsum,
    "matmul": _matmul,
    "reduce": _reduce,
    "broadcast": _broadcast,
    "reshape": _reshape,
    "transpose": _transpose,
    "concatenate": _concatenate,
    "slice": _slice,
    "softmax": _softmax,
    "take": _take,
}

LOSSES = ("jnp.sum({v} * {v})", "jnp.mean(jnp.tanh({v}))", "jnp.sum({v})")


@st.composite
def programs(draw: Callable, mesh: dict[str, int]) -> Program:
    """A straight-line program of 1-6 ops over 1+ inputs, forward or a gradient,
    with dims sized for `mesh` (and some that it does not divide)."""
    b = _Builder(draw, dim_sizes(mesh))
    rank = draw(st.integers(1, 3))
    b.new_input(tuple(b.dim() for _ in range(rank)))
    for _ in range(draw(st.integers(1, 6))):
        op = draw(st.sampled_from(sorted(OPS)))
        OPS[op](b, b.operand())
    computed = [n for n in b.values if n.startswith("v")] or list(b.values)
    chosen = draw(st.lists(st.sampled_from(computed), min_size=1, max_size=3, unique=True))
    outputs = tuple((n, b.values[n]) for n in sorted(chosen, key=_value_order))
    mode = draw(st.sampled_from(("forward", "forward", "grad", "value_and_grad")))
    loss = ""
    if mode != "forward":
        loss = " + ".join(draw(st.sampled_from(LOSSES)).format(v=n) for n, _ in outputs)
    return Program(tuple(b.inputs), tuple(b.lines), outputs, mode, loss)


def _axis_for(draw: Callable, size: int, mesh: dict[str, int]) -> str:
    """Mostly an axis that divides `size` (if any does), sometimes any axis."""
    dividing = [a for a, n in mesh.items() if size % n == 0]
    if dividing and draw(st.integers(0, 7)) != 7:
        return draw(st.sampled_from(dividing))
    return draw(st.sampled_from(list(mesh)))


def _leaf_tiling(draw: Callable, shape: tuple[int, ...], mesh: dict[str, int]) -> tuple:
    dims = draw(st.sets(st.integers(0, len(shape) - 1), min_size=1, max_size=min(2, len(shape))))
    return tuple((d, _axis_for(draw, shape[d], mesh)) for d in sorted(dims))


@st.composite
def tactic_specs(draw: Callable, program: Program, mesh: dict[str, int]) -> TacticSpec:
    if draw(st.integers(0, 3)) == 0:
        ranked = [x for x in program.inputs if x.shape]
        if not ranked or draw(st.integers(0, 3)) == 3:  # every input of rank >= 1
            size = math.gcd(*(x.shape[0] for x in ranked)) if ranked else 1
            return TacticSpec("BatchParallel", axis=_axis_for(draw, size, mesh))
        x = draw(st.sampled_from(ranked))
        return TacticSpec("BatchParallel", axis=_axis_for(draw, x.shape[0], mesh), inputs=x.name)
    leaves = [(x.name, x.shape) for x in program.inputs] + program.results()
    leaves = [(n, s) for n, s in leaves if s]
    picked = draw(st.lists(st.sampled_from(leaves), min_size=1, max_size=3, unique_by=lambda p: p[0]))
    return TacticSpec(
        "ManualPartition", spec=tuple((n, _leaf_tiling(draw, s, mesh)) for n, s in picked)
    )


@st.composite
def cases(draw: Callable, meshes: tuple[dict[str, int], ...] = MESHES, spmd_every: int = 8) -> Case:
    """A program, a mesh, 1-2 tactics, a data seed; about one case in
    `spmd_every` also runs the SPMD stage on the NumPy interpreter."""
    mesh = draw(st.sampled_from(meshes))
    program = draw(programs(mesh))
    tactics = tuple(draw(st.lists(tactic_specs(program, mesh), min_size=1, max_size=2)))
    seed = draw(st.integers(0, 2**16))
    return Case(program, mesh, tactics, seed, spmd_every)


def make_args(seed: int, inputs: list[tuple[tuple[int, ...], int | None]]) -> list[np.ndarray]:
    """The data of a case: standard-normal float32, or int32 indices in `[0, bound)`."""
    rng = np.random.default_rng(seed)
    return [
        rng.standard_normal(shape).astype(np.float32)
        if bound is None
        else rng.integers(0, bound, size=shape).astype(np.int32)
        for shape, bound in inputs
    ]
