"""Translation validation: run every stage of a partitioning and compare its numbers.

`partir.jit(..., check=True)` and `partir-opt --check-numerics` run each stage
on the same inputs and stop at the first whose outputs differ from the
original program's, naming the stage (and so the pass that produced it), the
first differing output by its pytree name, the index and both values:

- `partir.jit`: the original is `jax.jit(fn)` on the call's own arguments;
  the import stage, the stage after each tactic (core IR with loops) and the
  SPMD stage run on the reference interpreters (`dialects.interpreter`, and
  `dialects.interpreter.spmd`, which simulates every device), the emitted
  `shard_map` program on JAX.
- `partir-opt`: the original is the input module, interpreted on seeded
  random inputs (`random_arguments`); after each pass the module is
  interpreted again on the same inputs, and after `partir-emit-jax` the
  emitted program runs on JAX.

A mismatch is a bug in partir, never in the user's program. `Reference` says
how close is close enough.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import ml_dtypes
import numpy as np
from xdsl.dialects import func
from xdsl.dialects.builtin import IntegerType, ModuleOp, TensorType
from xdsl.ir import SSAValue
from xdsl.passes import ModulePass, PassPipeline
from xdsl.utils.exceptions import InterpretationError
from xdsl_jax.dialects import stablehlo as shlo
from xdsl_jax.xdsl_extras.traits import Elementwise

from dialects.attributes import ints
from dialects.dtypes import element_kind, numpy_dtype
from dialects.functions import entry_function
from dialects.interpreter import run_function
from dialects.interpreter.spmd import run_spmd
from dialects.partir import find_mesh
from dialects.spmd import DTensorType
from dialects.stablehlo_ext import DynamicUpdateSliceOp, SliceOp
from lowering.loader import load_source
from lowering.to_jax import emit_jax
from partir.devices import devices_for
from partir.spmd_form import is_spmd
from partir.tactics import ProgramView

# --------------------------------------------------------------------------
# How close is close enough

_RELATIVE: dict[np.dtype, float] = {
    np.dtype(np.float64): 1e-9,
    np.dtype(np.complex128): 1e-9,
    np.dtype(np.float32): 1e-5,
    np.dtype(np.complex64): 1e-5,
    np.dtype(np.float16): 1e-2,
    np.dtype(ml_dtypes.bfloat16): 6e-2,
}
_RELATIVE_8BIT = 0.25
NOISE_FACTOR = 32
"""How many times its own rounding sensitivity an output may move (`Reference`)."""
LOW_PRECISION_OUTLIERS = 0.01
"""The share of a 16- or 8-bit float output's elements (at least one) that
may fall outside the tolerance, inside the output's range (`Reference`)."""


def relative_tolerance(dtype: np.dtype) -> float:
    """`rtol` for outputs of `dtype` (see `Reference`); 0 means exact."""
    dtype = np.dtype(dtype)
    if element_kind(dtype) in "biu":
        return 0.0
    return _RELATIVE.get(dtype, _RELATIVE_8BIT)


def perturbed(args: Sequence[np.ndarray], seed: int = 1) -> list[np.ndarray]:
    """Each float argument times (1 + u * eps), u uniform in [-1, 1]: the
    inputs moved by up to one unit in the last place."""
    rng = np.random.default_rng(seed)
    out = []
    for a in args:
        a = np.asarray(a)
        if element_kind(a.dtype) == "f":
            eps = float(ml_dtypes.finfo(a.dtype).eps)
            wide = a.astype(np.float64) * (1 + eps * rng.uniform(-1, 1, a.shape))
            a = wide.astype(a.dtype)
        out.append(a)
    return out


@dataclass(frozen=True)
class Difference:
    """The first element of one output where a stage and the original disagree."""

    output: str
    index: tuple[int, ...] = ()
    got: Any = None
    want: Any = None
    dtype: np.dtype | None = None
    rtol: float = 0.0
    atol: float = 0.0
    count: int = 0
    size: int = 0
    detail: str = ""  # set instead of the values for a shape or dtype mismatch

    def describe(self) -> str:
        if self.detail:
            return f"{self.output} {self.detail}"
        where = f"{self.output} at index {self.index}" if self.index else self.output
        if self.rtol == 0:
            bound = f"{self.dtype}: must be equal"
        else:
            bound = (
                f"{self.dtype}: |difference| must be <= {self.rtol:g}*|original| + {self.atol:.3g}"
            )
        return (
            f"{where} is {_scalar(self.got)} but the original gives {_scalar(self.want)} "
            f"({bound}; {self.count} of {self.size} elements differ)"
        )


def _scalar(x: Any) -> str:
    value = np.asarray(x).item()
    if isinstance(value, float):
        return f"{value:.9g}"
    if isinstance(value, complex):
        return f"({value.real:.9g}{value.imag:+.9g}j)"
    return repr(value)


@dataclass(frozen=True)
class Reference:
    """The original program's outputs, and how far each may move.

    A stage's output `got` matches the original `want` where
    `|got - want| <= rtol * |want| + atol` elementwise (NaNs in the same
    places, infinities equal; integers and booleans exactly). `rtol` depends
    on the dtype only (`relative_tolerance`); per output,
    `atol = max(rtol * max|want|, NOISE_FACTOR * noise)`, where `noise` is how
    far the original itself moves when its inputs move by one ulp.

    Why not exact: the stages compute the same function in different orders.
    The interpreter widens dot_general and reductions to float64 and rounds
    once, XLA accumulates in float32 in its own order, and a partitioned
    program adds per-device partial sums in yet another. For well-scaled
    float32 programs the difference stays below about 1.1e-6 of the output's
    scale (8-way sharded contractions, K <= 8192, and the example training
    steps; shared/guides/jax.md section 4), so `rtol` 1e-5 leaves a 10x
    margin, and scaling `atol` by the output's largest entry keeps entries
    that cancel to near zero (arbitrary relative error) from failing. The
    other widths keep about as many ulps (float16 1e-2, bfloat16 6e-2; 8-bit
    floats 0.25). Ill-conditioned programs (unscaled weights through
    attention, whose float32 result is 2.6e-5 of scale from float64) round
    further: there `noise` says by how much, and float32's own error was at
    most 5.2x the noise on the examples, so 32x leaves a 6x margin. A broken
    rewrite is off by whole summands or slices, far beyond any of these.

    In 16- and 8-bit floats a program's discontinuities show: XLA keeps
    fused elementwise chains in float32 (excess precision) where the
    interpreter rounds every op, so a gradient that cancels to near zero may
    come out with the other sign, and Adam's first step (`m / sqrt(v)`, the
    gradient's sign) moves that element by twice the learning rate (an NNX
    GPT's bias in bfloat16: 1 of 256). Up to `LOW_PRECISION_OUTLIERS` of
    such an output's elements may differ, each inside the output's range
    (`|got| <= (1 + rtol) * max|want| + atol`); a broken slice moves more.
    """

    names: tuple[str, ...]
    outputs: tuple[np.ndarray, ...]
    noise: tuple[float, ...]

    @staticmethod
    def of(
        run: Callable[[Sequence[np.ndarray]], Sequence[Any]],
        args: Sequence[np.ndarray],
        names: Sequence[str],
    ) -> Reference:
        """Run the original on `args` and on `perturbed(args)`."""
        want = [np.asarray(x) for x in run(args)]
        moved = [np.asarray(x) for x in run(perturbed(args))]
        noise = []
        for w, m in zip(want, moved, strict=True):
            both = np.isfinite(w) & np.isfinite(m)
            if element_kind(w.dtype) in "fc" and both.any():
                noise.append(float(np.abs(w[both].astype(np.complex128) - m[both]).max()))
            else:
                noise.append(0.0)
        return Reference(tuple(names), tuple(want), tuple(noise))

    def first_difference(self, got: Sequence[Any]) -> Difference | None:
        """The first output (in result order) that differs from the original, and where."""
        if len(got) != len(self.outputs):
            return Difference(
                "the results", detail=f"are {len(got)}, the original's {len(self.outputs)}"
            )
        for name, g, w, noise in zip(self.names, got, self.outputs, self.noise, strict=True):
            difference = _first_difference(name, np.asarray(g), w, noise)
            if difference is not None:
                return difference
        return None


def _first_difference(
    name: str, got: np.ndarray, want: np.ndarray, noise: float
) -> Difference | None:
    rtol = relative_tolerance(want.dtype)
    if got.shape != want.shape or got.dtype != want.dtype:
        return Difference(
            name,
            detail=f"is {got.dtype}{list(got.shape)}, the original {want.dtype}{list(want.shape)}",
        )
    atol = 0.0
    if rtol == 0:
        bad = got != want
    else:
        g = got.astype(np.complex128 if np.iscomplexobj(want) else np.float64)
        w = want.astype(g.dtype)
        finite = np.isfinite(w)
        scale = float(np.abs(w[finite]).max()) if finite.any() else 0.0
        atol = max(rtol * scale, NOISE_FACTOR * noise)
        bad = ~np.isclose(g, w, rtol=rtol, atol=atol, equal_nan=True)
        if element_kind(want.dtype) == "f" and want.dtype.itemsize <= 2 and bad.any():
            inside = np.abs(g[bad]) <= (1 + rtol) * scale + atol
            if inside.all() and bad.sum() <= max(1, LOW_PRECISION_OUTLIERS * want.size):
                return None  # a discontinuity rounded the other way (`Reference`)
    if not bad.any():
        return None
    index = tuple(int(i) for i in np.argwhere(bad)[0])
    return Difference(
        name, index, got[index], want[index], want.dtype, rtol, atol, int(bad.sum()), want.size
    )


class ValidationError(ValueError):
    """A stage computes different numbers from the original program: a bug in partir.

    `stage` names the stage (or pass), `difference` the first differing output
    (None when the stage failed to run at all; the message says why).
    """

    def __init__(self, message: str, stage: str, difference: Difference | None = None):
        super().__init__(message)
        self.stage = stage
        self.difference = difference


@dataclass
class StageChecker:
    """Runs stages in order against one `Reference`, raising `ValidationError`
    at the first that differs or fails to run."""

    reference: Reference
    who: str  # the option that asked, which starts every message
    note: str = ""  # appended to a mismatch (e.g. which inputs were used)
    hint: str = "please report it with the stages, `.lower(*args).stages`"
    passed: list[str] = field(default_factory=list)

    def check(self, stage: str, what: str, run: Callable[[], Sequence[Any]]) -> None:
        """Run one stage; `what` says what produced it and how it is run."""
        agreed = "; the stages before it agree: " + ", ".join(self.passed) if self.passed else ""
        try:
            got = run()
        except Exception as err:  # any failure of a stage the original ran through
            raise ValidationError(
                f"{self.who}: {what} fails: {_first_line(err)}{agreed}. "
                f"This is a bug in partir: {self.hint}",
                stage,
            ) from err
        difference = self.reference.first_difference(got)
        if difference is not None:
            raise ValidationError(
                f"{self.who}: {what} changes the numbers: {difference.describe()}"
                f"{self.note}{agreed}. This is a bug in partir: {self.hint}",
                stage,
                difference,
            )
        self.passed.append(stage)


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def reference_error(who: str, err: InterpretationError) -> ValidationError:
    return ValidationError(
        f"{who}: cannot run the original program on the reference interpreter "
        f"({_first_line(err)}); run without {who}",
        "original",
    )


# --------------------------------------------------------------------------
# Running a stage


def result_names(module: ModuleOp) -> list[str]:
    """The entry function's results by pytree name (`result[i]` if unnamed)."""
    return [leaf.name for leaf in ProgramView.of(entry_function(module)).results]


def argument_arrays(module: ModuleOp, leaves: Sequence[Any]) -> list[np.ndarray]:
    """The flat arguments as arrays of the entry function's dtypes (as JAX
    converts them: Python scalars, float64 arrays without x64)."""
    types = entry_function(module).function_type.inputs.data
    return [
        np.asarray(x).astype(numpy_dtype(t.element_type), copy=False)
        if isinstance(t, TensorType)
        else np.asarray(x)
        for x, t in zip(leaves, types, strict=True)
    ]


def run_stage(module: ModuleOp, args: Sequence[Any]) -> list[np.ndarray]:
    """Run any stage on flat global arguments: the SPMD interpreter (every
    device simulated) for an SPMD module, the sequential interpreter else."""
    if is_spmd(entry_function(module)):
        return run_spmd(module, args)
    return run_function(module, args)  # the entry function, as `entry_function` defines it


# --------------------------------------------------------------------------
# Random inputs, for programs given without arguments


def index_bounds(entry: func.FuncOp) -> dict[int, int]:
    """Per integer argument that ends up (through integer-valued ops) as the
    start of a gather, scatter or dynamic (update) slice: the exclusive bound
    below which every window it starts stays inside its operand.

    Out-of-range starts are well defined (clamped, or filled by `jnp.take`),
    but random ones would land almost all out of range and test only that.
    """
    bounds: dict[int, int] = {}
    for i, arg in enumerate(entry.body.block.args):
        if not _is_integer(arg):
            continue
        found: list[int] = []
        seen: set[SSAValue] = set()
        work: list[SSAValue] = [arg]
        while work:
            value = work.pop()
            if value in seen:
                continue
            seen.add(value)
            for use in value.uses:
                bound = _window_bound(use.operation, use.index)
                if bound is not None:
                    found.append(bound)
                else:
                    work += [r for r in use.operation.results if _is_integer(r)]
        if found:
            bounds[i] = max(1, min(found))
    return bounds


def _is_integer(value: SSAValue) -> bool:
    ty = value.type
    if isinstance(ty, DTensorType):
        ty = ty.global_type
    return (
        isinstance(ty, TensorType)
        and isinstance(ty.element_type, IntegerType)
        and ty.element_type.width.data > 1
    )


def _shape(value: SSAValue) -> tuple[int, ...]:
    ty = value.type
    if isinstance(ty, DTensorType):
        ty = ty.global_type
    assert isinstance(ty, TensorType)
    return tuple(ty.get_shape())


def _window_bound(op: Any, operand: int) -> int | None:
    """The bound on a start index `op` takes as its `operand`-th operand (None:
    not a start index)."""
    if isinstance(op, shlo.GatherOp) and operand == 1:
        shape, sizes = _shape(op.operand), ints(op.slice_sizes)
        dims = ints(op.dimension_numbers.start_index_map)
        return min((shape[d] - sizes[d] + 1 for d in dims), default=None)
    if isinstance(op, shlo.DynamicSliceOp) and operand >= 1:
        d = operand - 1
        return _shape(op.operand)[d] - ints(op.slice_sizes)[d] + 1
    if isinstance(op, DynamicUpdateSliceOp) and operand >= 2:
        d = operand - 2
        return _shape(op.operand)[d] - _shape(op.update)[d] + 1
    if isinstance(op, shlo.ScatterOp) and operand == len(op.inputs):
        dn = op.scatter_dimension_numbers
        shape = _shape(op.inputs[0])
        collapsed = set(ints(dn.inserted_window_dims)) | set(ints(dn.input_batching_dims))
        window_dims = ints(dn.update_window_dims)
        update_shape = _shape(op.updates[0])
        windowed = [d for d in range(len(shape)) if d not in collapsed]
        window = {d: update_shape[w] for d, w in zip(windowed, window_dims, strict=False)}
        dims = ints(dn.scatter_dims_to_operand_dims)
        return min((shape[d] - window.get(d, 1) + 1 for d in dims), default=None)
    return None


_DOMAIN_OPS = (shlo.SqrtOp, shlo.RsqrtOp, shlo.LogOp, shlo.LogPlusOneOp, shlo.PowerOp)
"""Ops defined (without NaN) only for positive operands (`power`: its base)."""
_VALUE_PRESERVING = (
    shlo.BroadcastInDimOp,
    shlo.ReshapeOp,
    shlo.TransposeOp,
    SliceOp,
    shlo.ConcatenateOp,
    shlo.ConvertOp,
)


def positive_arguments(entry: func.FuncOp) -> set[int]:
    """The float arguments that flow, through elementwise and data-movement
    ops only, into the operand of a `_DOMAIN_OPS` op: Adam's second moment
    into `sqrt`, a variance into `rsqrt`. (A value that passes a contraction
    or reduction first no longer has the argument's sign.)"""
    found: set[int] = set()
    for i, arg in enumerate(entry.body.block.args):
        seen: set[SSAValue] = set()
        work: list[SSAValue] = [arg]
        while work and i not in found:
            value = work.pop()
            if value in seen:
                continue
            seen.add(value)
            for use in value.uses:
                op = use.operation
                if isinstance(op, _DOMAIN_OPS) and use.index == 0:
                    found.add(i)
                elif op.has_trait(Elementwise) or isinstance(op, _VALUE_PRESERVING):
                    work += op.results
    return found


FLOAT_RANGE = (0.5, 1.5)
"""Where the floats of `positive_arguments` are drawn from."""
COUNT_RANGE = (1, 5)
"""Integers that are not indices (step counts, sizes): small and nonzero."""


def random_arguments(module: ModuleOp, seed: int = 0) -> list[np.ndarray]:
    """Deterministic inputs of the entry function's global shapes and dtypes.

    Floats are standard normal: both signs, so `max`, `select` and relu take
    both branches, and the sums of a contraction cancel as little as real
    data's. The `positive_arguments` are uniform in `FLOAT_RANGE` instead, so
    `sqrt`, `log` and the like stay in their domain. (All-positive data would
    not do: sums of positive products grow with their length, softmax
    saturates, and float32 itself drifts by percents from the exact result.)
    Integers that start a window (`index_bounds`) lie in `[0, bound)`; other
    integers in `COUNT_RANGE`; booleans are fair coins. Where the program still
    gives NaN, the NaNs must appear in the same places in every stage.
    """
    rng = np.random.default_rng(seed)
    entry = entry_function(module)
    bounds = index_bounds(entry)
    positive = positive_arguments(entry)
    out = []
    for i, ty in enumerate(entry.function_type.inputs.data):
        if isinstance(ty, DTensorType):
            ty = ty.global_type
        if not isinstance(ty, TensorType):
            raise InterpretationError(f"argument {i} has type {ty}, not a tensor")
        shape, dtype = tuple(ty.get_shape()), numpy_dtype(ty.element_type)
        kind = element_kind(dtype)
        if kind == "b":
            value = rng.integers(0, 2, shape).astype(bool)
        elif kind in "iu":
            low, high = (0, bounds[i]) if i in bounds else COUNT_RANGE
            value = rng.integers(low, high, shape)
        elif kind == "c":
            value = rng.standard_normal(shape) + 1j * rng.standard_normal(shape)
        elif i in positive:
            value = rng.uniform(*FLOAT_RANGE, shape)
        else:
            value = rng.standard_normal(shape)
        out.append(np.asarray(value).astype(dtype))
    return out


# --------------------------------------------------------------------------
# partir-opt --check-numerics: every pass, before vs after


class PassChecker:
    """The pipeline callback of `partir-opt --check-numerics`: before the first
    pass it interprets the input module on `random_arguments(seed)`, after
    each pass the module again, and stops at the first pass that changed an
    output."""

    def __init__(self, seed: int = 0):
        self.seed = seed
        self.args: list[np.ndarray] = []
        self.checker: StageChecker | None = None

    def __call__(self, done: ModulePass | None, module: ModuleOp, _: ModulePass | None) -> None:
        if done is None:
            self.args = random_arguments(module, self.seed)
            try:
                reference = Reference.of(
                    lambda a: run_stage(module, a), self.args, result_names(module)
                )
            except InterpretationError as err:
                raise reference_error("--check-numerics", err) from err
            note = f" (random inputs, seed {self.seed})"
            hint = "please report it with the input and the pipeline"
            self.checker = StageChecker(reference, "--check-numerics", note, hint)
            return
        assert self.checker is not None
        if done.name == EMIT_JAX:
            run = emitted_program(module)
            what = f"pass {EMIT_JAX} (the emitted jax.shard_map program, run by JAX)"
            self.checker.check(done.name, what, lambda: [np.asarray(x) for x in run(*self.args)])
        else:
            self.checker.check(done.name, f"pass {done.name}", lambda: run_stage(module, self.args))


EMIT_JAX = "partir-emit-jax"
"""The pass whose output is a Python program: checked by running that on JAX."""


def emitted_program(module: ModuleOp) -> Callable[..., Sequence[Any]]:
    """The SPMD `module` emitted as a `jax.shard_map` program on the first
    devices JAX has (the module's mesh needs that many); it takes and returns
    flat global arrays."""
    mesh_op = find_mesh(module)
    assert mesh_op is not None  # partir-emit-jax has checked that
    try:
        jax_mesh = devices_for(mesh_op.mesh, None)
    except ValueError as err:
        raise ValidationError(
            f"--check-numerics: cannot run the emitted program: {err}", EMIT_JAX
        ) from err
    return load_source(emit_jax(module), "checked_program").build(jax_mesh)


def checking_numerics(pipeline: PassPipeline, seed: int = 0) -> PassPipeline:
    """`pipeline` with a `PassChecker` run after its own callback."""
    inner = pipeline.callback
    checker = PassChecker(seed)

    def callback(done: ModulePass | None, module: ModuleOp, following: ModulePass | None) -> None:
        if inner is not None:
            inner(done, module, following)
        checker(done, module, following)

    return PassPipeline(pipeline.passes, callback)


# --------------------------------------------------------------------------
# partir.jit(check=True): every stage on the call's arguments


def _what_made(stage: str) -> str:
    if stage == "import":
        return "stage 'import' (the StableHLO from JAX, on the reference interpreter)"
    if stage == "spmd":
        return "stage 'spmd' (pass partir-lower-spmd, on the SPMD interpreter)"
    return f"stage {stage!r} (tactic {stage} with its propagation, on the reference interpreter)"


class CheckedCall:
    """What `partir.jit(check=True)` calls for one argument signature: the
    emitted program, run only after every stage of its lowering has been
    checked on the call's arguments against `jax.jit(fn)` (each stage is the
    snapshot `partir.Lowered` keeps; the interpreters do not modify it)."""

    def __init__(self, fn: Callable[..., Any], lowered: Any, compiled: Callable[..., Any]):
        import jax

        self.original = jax.jit(fn)
        self.stages = [(stage.name, stage.module) for stage in lowered.stages]
        self.names = result_names(self.stages[0][1])
        self.compiled = compiled

    def __call__(self, *args: Any) -> Any:
        import jax

        leaves, tree = jax.tree_util.tree_flatten(args)
        flat = argument_arrays(self.stages[0][1], leaves)

        def run_original(inputs: Sequence[np.ndarray]) -> list[Any]:
            # Python scalars stay as given: JAX types them weakly.
            same = [
                x if isinstance(x, int | float | complex) else y
                for x, y in zip(leaves, inputs, strict=True)
            ]
            outputs = self.original(*jax.tree_util.tree_unflatten(tree, same))
            return jax.tree_util.tree_leaves(outputs)

        checker = StageChecker(Reference.of(run_original, flat, self.names), "check=True")
        for name, module in self.stages:
            got: Sequence[Any] | None = None
            if name == "import":  # the interpreter must run the program at all
                try:
                    got = run_stage(module, flat)
                except InterpretationError as err:
                    raise reference_error("check=True", err) from err

            def run(m: ModuleOp = module, got: Sequence[Any] | None = got) -> Sequence[Any]:
                return got if got is not None else run_stage(m, flat)

            checker.check(name, _what_made(name), run)
        result: list[Any] = []

        def emitted() -> list[Any]:
            result.append(self.compiled(*args))
            return jax.tree_util.tree_leaves(result[0])

        checker.check(
            "emitted", "the emitted jax.shard_map program (pass partir-emit-jax)", emitted
        )
        return result[0]
