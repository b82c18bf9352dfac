"""A training step's pipeline structure, read from its jaxpr.

A step that differentiates a loss through a `lax.scan` over stacked layers
traces (`jax.make_jaxpr`) to five segments:

    pre      the ops before the layer loop (embedding; whatever makes its carry)
    forward  the scan over the layers (its carry: the activation; its outputs
             beyond the carry: the residuals the backward reads)
    head     the ops between the loops (the loss, and its gradient, the
             backward's carry on entry)
    backward the reverse scan JAX's transpose made (its outputs: the gradient
             of the carry and of each stacked leaf)
    update   the ops after it (the optimizer)

The step is traced three times: as given; with every stacked leaf (the
loop's parameters and the optimizer state that mirrors them) cut to one
stage's layers; and with that and the data cut to one microbatch of one
data-parallel shard. The traces align op for op, so comparing them says
which dim of each loop operand is the batch (it shrinks with the
microbatch), which results are stacked (they shrink with the layers), and
whether each op outside the loops keeps the layers apart
(`partir.pipeline.apart`; a stage sees only its own layers), or, in the
update, reduces over them (completed across stages by the engine).

Each trace has its calls inlined, so a loop inside a jitted helper is found.
A step that fixes its layer count (flax's `nn.scan(length=...)`) cannot be
called with a stage's layers; then it is traced with every layer, at each
batch, and those jaxprs run with the layers cut (`partir.pipeline.replay`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import jax
import numpy as np
from jax.extend.core import ClosedJaxpr, JaxprEqn, Literal, Var
from xdsl.dialects.builtin import StringAttr

from dialects.errors import PartirValueError, UnsupportedError
from dialects.escaping import quoted
from partir.importer import argument_paths, result_paths
from partir.pipeline.apart import (
    ACROSS,
    CLEAN,
    LAYER_REDUCTIONS,
    MIXED,
    SUMMED,
    cut_dims,
    keeps_apart,
    makes_along_cut,
    reads_across,
    reads_across_eqns,
)
from partir.pipeline.layer_loops import PipelineError
from partir.pipeline.replay import replay
from partir.roles import Roles
from partir.selectors import display_path, select, slash_path


def _name(path: str) -> str:
    return quoted(display_path(path))


@dataclass(frozen=True)
class _Leaf:
    """An argument or result for `partir.roles` (its `NamedLeaf`)."""

    name: str
    type: StringAttr
    shape: tuple[int, ...]


@dataclass(frozen=True)
class StepStructure:
    """Where a step's layer loops are, and how each value splits."""

    full: ClosedJaxpr
    """The step as given (its loops at every layer, the whole batch)."""
    local: ClosedJaxpr
    """The step with each stacked leaf cut to one stage's layers, at the full batch."""
    micro: ClosedJaxpr
    """The same, on one microbatch of one data-parallel shard."""
    forward: int
    backward: int
    """Indices of the two loops in `local.jaxpr.eqns`."""
    micro_loops: tuple[int, int]
    """Their indices in `micro.jaxpr.eqns` (the same loops: JAX may trace the
    ops around them differently for one row, dropping or adding a broadcast)."""
    layers: int
    stacked: tuple[int, ...]
    """Argument leaves split over the stage axis on dim 0 (the loop's parameters, and
    the optimizer state mirroring them)."""
    stacked_results: tuple[int, ...]
    batch: int
    """The global batch; `micro` runs `batch // (microbatches * data_parts)` rows of it."""
    micro_rows: int
    operand_batch_dim: dict[tuple[int, int], int]
    """(loop eqn index, operand index) -> its batch dim, for operands that have one."""
    result_batch_dim: dict[tuple[int, int], int]
    arg_names: tuple[str, ...]
    optimizer_state: tuple[int, ...] = ()
    """Stacked argument leaves that are not the loop's parameters (the
    optimizer state mirroring them): what ZeRO beside the Pipeline splits."""
    zero: ClosedJaxpr | None = None
    """With ZeRO beside the Pipeline: the step with each stacked leaf cut to
    one data shard's share of one stage's layers (its update runs on that)."""
    across_layers: dict[int, str] = field(default_factory=dict)
    """Update equations (by index, the same in `local` and `zero`) that reduce
    a stacked value over its layers, by how their partial results combine
    (`partir.pipeline.apart.LAYER_REDUCTIONS`): a global gradient norm, an
    all-finite check. A stage reduces its own layers; the engine completes it
    across stages."""

    @property
    def forward_eqn(self) -> JaxprEqn:
        return self.local.jaxpr.eqns[self.forward]

    @property
    def backward_eqn(self) -> JaxprEqn:
        return self.local.jaxpr.eqns[self.backward]

    @property
    def micro_forward(self) -> JaxprEqn:
        return self.micro.jaxpr.eqns[self.micro_loops[0]]

    @property
    def micro_backward(self) -> JaxprEqn:
        return self.micro.jaxpr.eqns[self.micro_loops[1]]

    def head_split(self) -> tuple[list[int], list[int]]:
        """The head's equations (between the loops), by index: those that read
        the forward loop's results, directly or not (the last stage runs them,
        on what the loop made), and the others (every stage runs them, before
        the schedule). The traces align, so the indices hold in each."""
        eqns = self.local.jaxpr.eqns
        tainted = set(eqns[self.forward].outvars)
        late, early = [], []
        for i in range(self.forward + 1, self.backward):
            if tainted & {v for v in eqns[i].invars if isinstance(v, Var)}:
                late.append(i)
                tainted |= set(eqns[i].outvars)
            else:
                early.append(i)
        return late, early

    def zero_vars(self) -> dict[Any, Any]:
        """Each variable of `zero` by the `local` variable it stands for (the
        traces align op for op)."""
        assert self.zero is not None
        a, b = self.local.jaxpr, self.zero.jaxpr
        found = dict(zip(b.invars, a.invars, strict=True))
        found.update(zip(b.constvars, a.constvars, strict=True))
        for mine, theirs in zip(b.eqns, a.eqns, strict=True):
            found.update(zip(mine.outvars, theirs.outvars, strict=True))
        return found

    @property
    def activation_bytes(self) -> int:
        """Bytes of one microbatch's activation (the forward loop's carry): what
        one transfer between stages moves, either way."""
        fwd = self.micro_forward
        return avals_bytes(v.aval for v in fwd.outvars[: fwd.params["num_carry"]])

    def zero_split(self, zero: int) -> set[int]:
        """The stacked leaves ZeRO stage `zero` splits over the data axis: the
        optimizer state (1, 2), and the parameters too (3)."""
        if zero == 3:
            return set(self.stacked)
        return set(self.optimizer_state) if zero else set()

    def carries(self, eqn: JaxprEqn) -> range:
        consts = eqn.params["num_consts"]
        return range(consts, consts + eqn.params["num_carry"])


def _flat(fn: Callable[..., Any], tree: Any) -> Callable[..., Any]:
    def flat(*leaves: Any) -> Any:
        return jax.tree_util.tree_leaves(fn(*jax.tree_util.tree_unflatten(tree, list(leaves))))

    return flat


def avals_bytes(avals: Iterable[Any]) -> int:
    """The bytes of arrays shaped and typed as `avals`."""
    return sum(int(np.prod(a.shape)) * np.dtype(a.dtype).itemsize for a in avals)


def _leading(
    shapes: Sequence[jax.ShapeDtypeStruct], chosen: set[int], size: int
) -> list[jax.ShapeDtypeStruct]:
    """`shapes` with the leading dim of the `chosen` leaves cut to `size`."""
    return [
        jax.ShapeDtypeStruct((size, *s.shape[1:]), s.dtype) if i in chosen else s
        for i, s in enumerate(shapes)
    ]


def _dtype(x: Any) -> Any:
    return jax.dtypes.canonicalize_dtype(getattr(x, "dtype", None) or np.result_type(x))


def _trace(fn: Callable[..., Any], shapes: Sequence[jax.ShapeDtypeStruct]) -> ClosedJaxpr:
    """`fn`'s jaxpr with its calls inlined (`partir.pipeline.replay`): a layer
    loop inside a jitted helper is then an equation of the step itself."""
    return replay(jax.make_jaxpr(fn)(*shapes), shapes)


def _trace_cut(
    fn: Callable[..., Any], shapes: Sequence[jax.ShapeDtypeStruct], what: str
) -> ClosedJaxpr:
    """`fn` traced at cut shapes, or a `PipelineError` saying the step fixes a
    size the Pipeline cuts (it runs the step's own code at those shapes)."""
    try:
        return _trace(fn, shapes)
    except PartirValueError:
        raise
    except Exception as err:  # the user's code, at shapes it was not written for
        raise _fixes_a_size(what, err) from err


def _replayed(
    closed: ClosedJaxpr, shapes: Sequence[jax.ShapeDtypeStruct], what: str, first: Exception
) -> ClosedJaxpr:
    """`closed` run again at cut shapes (`partir.pipeline.replay`), or the
    error of calling the step there (`first`), since replaying failed too."""
    try:
        return replay(closed, shapes)
    except Exception as err:
        raise _fixes_a_size(what, first) from err


def _fixes_a_size(what: str, err: Exception) -> PipelineError:
    text = str(err).strip()
    first = text.splitlines()[0] if text else ""
    return PipelineError(
        f"{what}: tracing the step at those shapes failed ({type(err).__name__}: "
        f"{quoted(first)}), and so did running its jaxpr there. Pipeline runs the step "
        "with each stacked leaf cut to a stage's layers and the batch cut to a "
        "microbatch; a step that fixes its layer count in a shape (a reshape or a "
        "broadcast to a fixed size), or its batch anywhere, cannot run there: take "
        "those sizes from the arguments' shapes"
    )


def _is_scan(eqn: JaxprEqn) -> bool:
    return eqn.primitive.name == "scan"


def find_structure(
    fn: Callable[..., Any],
    args: Sequence[Any],
    *,
    stages: int,
    microbatches: int,
    data_parts: int,
    stacked: str | Sequence[str] | None,
    axis: str,
    zero_parts: int = 1,
) -> StepStructure:
    """Trace `fn` at `args` and split it as the module docstring says, or raise
    a `PipelineError` naming what does not fit and what to do."""
    leaves, tree = jax.tree_util.tree_flatten(tuple(args))
    names = argument_paths(fn, args)
    flat = _flat(fn, tree)
    shapes = [
        jax.ShapeDtypeStruct(np.shape(x), _dtype(x))
        for x in leaves
    ]
    full = _trace(flat, shapes)
    invar_index = {v: i for i, v in enumerate(full.jaxpr.invars)}
    forward = _find_forward(full, invar_index, names, stacked)
    eqn = full.jaxpr.eqns[forward]
    layers = eqn.params["length"]
    if layers % stages:
        raise PipelineError(
            f"Pipeline({quoted(axis)}): {layers} layers do not split over {stages} stages; "
            f"use an axis of a size dividing {layers}, or a stack of a multiple of {stages} layers"
        )
    params = _stacked_params(full, forward, invar_index, names, stacked, layers)
    mirrored = _with_mirrors(params, names, shapes)
    out_info = jax.eval_shape(fn, *args)
    result_leaves = [
        _Leaf(n, StringAttr(str(a.dtype)), tuple(a.shape))
        for n, a in zip(result_paths(out_info), jax.tree_util.tree_leaves(out_info), strict=True)
    ]
    arg_leaves = [
        _Leaf(n, StringAttr(str(s.dtype)), tuple(s.shape))
        for n, s in zip(names, shapes, strict=False)
    ]
    data = Roles.of(arg_leaves, result_leaves).data(
        [leaf for i, leaf in enumerate(arg_leaves) if i not in mirrored]
    )
    if isinstance(data, str):
        raise PipelineError(f"Pipeline({quoted(axis)}): {data}")
    batch = data[0].shape[0]
    parts = microbatches * data_parts
    if microbatches < 1 or batch % parts:
        split = f"{microbatches} microbatches" + (
            f" x {data_parts} data-parallel shards" if data_parts > 1 else ""
        )
        raise PipelineError(
            f"Pipeline({quoted(axis)}): the batch of {batch} ({_name(data[0].name)}) does not "
            f"split into {split}; choose microbatches dividing {batch // data_parts}"
            if batch % data_parts == 0
            else f"Pipeline({quoted(axis)}): the batch of {batch} does not split over "
            f"{data_parts} data-parallel shards"
        )
    data_index = {names.index(leaf.name) for leaf in data}
    per_stage = layers // stages
    local_shapes = _leading(shapes, mirrored, per_stage)
    here = f"Pipeline({quoted(axis)})"
    at_stage = f"{here} with one stage's {per_stage} layers"
    replaying: Exception | None = None
    try:
        local = _trace(flat, local_shapes)
    except PartirValueError:
        raise
    except Exception as err:
        # The step fixes its layer count (flax's nn.scan(length=...)): trace it with
        # every layer at each batch, and run those jaxprs with the layers cut.
        replaying = err
        local = _replayed(full, local_shapes, at_stage, err)

    def at_rows(rows: int) -> ClosedJaxpr:
        """The stage-local step traced with `rows` examples of the batch."""
        what = f"{here} with one microbatch of {rows} rows"

        if replaying is None:
            return _trace_cut(flat, _leading(local_shapes, data_index, rows), what)
        every_layer = _trace_cut(flat, _leading(shapes, data_index, rows), what)
        return _replayed(every_layer, _leading(local_shapes, data_index, rows), what, replaying)

    micro = at_rows(batch // parts)
    _check_aligned(full, local)
    local = _whole_literals(full, local)
    zero = None
    if zero_parts > 1:
        if per_stage % zero_parts:
            raise PipelineError(
                f"Pipeline({quoted(axis)}) with ZeRO: each stage's {per_stage} layers do not "
                f"split over {zero_parts} data-parallel shards; ZeRO beside a Pipeline splits "
                "the optimizer state on the layer dim: use a stack of a multiple of "
                f"{stages * zero_parts} layers"
            )
        share = _leading(shapes, mirrored, per_stage // zero_parts)
        at_share = f"{here} with ZeRO's share of {per_stage // zero_parts} layers"
        zero = (
            _replayed(full, share, at_share, replaying) if replaying
            else _trace_cut(flat, share, at_share)
        )
        _check_aligned(local, zero)
        zero = _whole_literals(full, zero)
    backward = _find_backward(local, forward)
    across_layers = _check_layerwise(full, local, forward, backward)
    micro_loops = (_same_loop(local, micro, forward), _same_loop(local, micro, backward))
    operand_dims, result_dims = {}, {}
    for index, micro_index in zip((forward, backward), micro_loops, strict=True):
        big, small = local.jaxpr.eqns[index], micro.jaxpr.eqns[micro_index]
        for k, (a, b) in enumerate(zip(big.invars, small.invars, strict=True)):
            dim = _batch_dim(a.aval.shape, b.aval.shape)
            if dim is not None:
                operand_dims[(index, k)] = dim
        for k, (a, b) in enumerate(zip(big.outvars, small.outvars, strict=True)):
            dim = _batch_dim(a.aval.shape, b.aval.shape)
            if dim is not None:
                result_dims[(index, k)] = dim
    stacked_results = tuple(
        i
        for i, (a, b) in enumerate(zip(full.jaxpr.outvars, local.jaxpr.outvars, strict=True))
        if a.aval.shape != b.aval.shape
    )
    structure = StepStructure(
        full,
        local,
        micro,
        forward,
        backward,
        micro_loops,
        layers,
        tuple(sorted(mirrored)),
        stacked_results,
        batch,
        batch // parts,
        operand_dims,
        result_dims,
        tuple(names),
        tuple(sorted(mirrored - params)),
        zero,
        across_layers,
    )
    _check_carries(structure, axis)
    if parts > 1:  # a microbatch is not the whole batch: is each example apart?
        # (one row can trace differently, dropping size-1 broadcasts: probe with 2 then)
        rows = batch // parts if batch // parts > 1 else 2 if batch != 2 else 4
        probe = micro if rows == batch // parts else at_rows(rows)
        loops = (_same_loop(local, probe, forward), _same_loop(local, probe, backward))
        _check_rows_apart(structure, axis, probe, loops)
    return structure


def _find_forward(
    full: ClosedJaxpr,
    invar_index: dict[Any, int],
    names: list[str],
    stacked: str | Sequence[str] | None,
) -> int:
    chosen = set(select(stacked, names)) if stacked is not None else None
    if chosen is not None and not chosen:
        raise PipelineError(
            f"Pipeline: stacked={stacked!r} selects no argument; the arguments are "
            + ", ".join(_name(n) for n in names[:8])
            + (" ..." if len(names) > 8 else "")
        )
    for i, eqn in enumerate(full.jaxpr.eqns):
        if not _is_scan(eqn) or eqn.params["reverse"]:
            continue
        xs = eqn.invars[eqn.params["num_consts"] + eqn.params["num_carry"] :]
        read = {invar_index[v] for v in xs if isinstance(v, Var) and v in invar_index}
        if read and (chosen is None or read & chosen):
            return i
    what = "the selected leaves" if chosen else "stacked arguments"
    raise PipelineError(
        f"Pipeline: found no loop over {what} in the step: Pipeline splits a `lax.scan` "
        "whose xs are parameters stacked on a leading layer dim (as `examples.scanned_stack` "
        "writes them); write the layers as such a scan, or name them with stacked="
    )


def _stacked_params(
    full: ClosedJaxpr,
    forward: int,
    invar_index: dict[Any, int],
    names: list[str],
    stacked: str | Sequence[str] | None,
    layers: int,
) -> set[int]:
    eqn = full.jaxpr.eqns[forward]
    xs = eqn.invars[eqn.params["num_consts"] + eqn.params["num_carry"] :]
    found = {invar_index[v] for v in xs if isinstance(v, Var) and v in invar_index}
    if stacked is not None:
        found = set(select(stacked, names))
    for i in sorted(found):
        shape = full.jaxpr.invars[i].aval.shape
        if not shape or shape[0] != layers:
            raise PipelineError(
                f"Pipeline: {_name(names[i])} (shape {tuple(shape)}) is not stacked on a "
                f"leading layer dim of {layers}, the loop's length; select only the loop's "
                "stacked parameters with stacked="
            )
    return found


def _with_mirrors(
    params: set[int], names: list[str], shapes: Sequence[jax.ShapeDtypeStruct]
) -> set[int]:
    """The stacked parameters and every leaf of the same shape whose path ends with
    one's path below its root (the optimizer's copies, `opt_state/m/blocks/w`)."""
    return set(params) | set(mirrored_params(params, names, [s.shape for s in shapes]))


def mirrored_params(
    params: Sequence[int] | set[int], names: Sequence[str], shapes: Sequence[tuple[int, ...]]
) -> dict[int, int]:
    """Each leaf, other than the parameters, whose path ends with a parameter's
    path below its root and whose shape is that parameter's, by that parameter."""
    tails = [(tuple(slash_path(names[i]).split("/")[1:]), tuple(shapes[i]), i) for i in params]
    found: dict[int, int] = {}
    for i, name in enumerate(names):
        segments = tuple(slash_path(name).split("/")[1:])
        for tail, shape, param in tails:
            if i not in params and tail and tuple(shapes[i]) == shape and (
                segments[-len(tail) :] == tail
            ):
                found.setdefault(i, param)
    return found


def _find_backward(local: ClosedJaxpr, forward: int) -> int:
    made = set(local.jaxpr.eqns[forward].outvars)
    for i, eqn in enumerate(local.jaxpr.eqns[forward + 1 :], forward + 1):
        if _is_scan(eqn) and eqn.params["reverse"] and made & set(eqn.invars):
            return i
    raise PipelineError(
        "Pipeline: the step has no backward loop over the layers: Pipeline partitions a "
        "training step (jax.grad or jax.value_and_grad of a loss through the stacked "
        "loop); a forward pass alone needs no pipeline schedule"
    )


def _check_aligned(full: ClosedJaxpr, local: ClosedJaxpr) -> None:
    kinds = [[e.primitive.name for e in t.jaxpr.eqns] for t in (full, local)]
    if kinds[0] != kinds[1]:
        raise UnsupportedError(
            "Pipeline: the step traces to a different program for one stage's layers "
            "(its Python code branches on the number of layers); Pipeline needs one program"
        )
    for a, b in zip(full.jaxpr.constvars, local.jaxpr.constvars, strict=True):
        if a.aval.shape != b.aval.shape:
            raise UnsupportedError(
                "Pipeline: the step builds a constant sized by the number of layers (shape "
                f"{tuple(a.aval.shape)}, e.g. np.arange of a stacked leaf's length); each "
                "stage would get the first layers' part of it: make it from a stacked "
                "argument, or inside the loop"
            )


def _whole_literals(full: ClosedJaxpr, cut: ClosedJaxpr) -> ClosedJaxpr:
    """`cut` with the literals of `full` where they differ: a number the step
    computed from a shape (`jnp.mean`'s count, `len(layers)`) means the whole
    stack's, which a stage's trace has as its own part's."""
    eqns = []
    for a, b in zip(full.jaxpr.eqns, cut.jaxpr.eqns, strict=True):
        swapped = [
            x if isinstance(x, Literal) and isinstance(y, Literal) and not _same(x, y) else y
            for x, y in zip(a.invars, b.invars, strict=True)
        ]
        eqns.append(b if swapped == list(b.invars) else b.replace(invars=swapped))
    return ClosedJaxpr(cut.jaxpr.replace(eqns=eqns), cut.consts)


def _same(x: Any, y: Any) -> bool:
    return bool(np.array_equal(np.asarray(x.val), np.asarray(y.val)))


def _same_loop(local: ClosedJaxpr, micro: ClosedJaxpr, index: int) -> int:
    """The index in `micro` of `local`'s loop `index`: the scan of the same rank
    among the scans, with as many operands and results."""
    scans = [i for i, e in enumerate(local.jaxpr.eqns) if _is_scan(e)]
    micro_scans = [i for i, e in enumerate(micro.jaxpr.eqns) if _is_scan(e)]
    rank = scans.index(index)
    mine, theirs = local.jaxpr.eqns[index], None
    if len(micro_scans) == len(scans):
        theirs = micro.jaxpr.eqns[micro_scans[rank]]
    if theirs is None or (len(theirs.invars), len(theirs.outvars), theirs.params["reverse"]) != (
        len(mine.invars),
        len(mine.outvars),
        mine.params["reverse"],
    ):
        raise UnsupportedError(
            "Pipeline: the step's layer loops trace differently for one microbatch (its "
            "Python code branches on the batch size); Pipeline needs the same loops"
        )
    return micro_scans[rank]


def _batch_dim(big: tuple[int, ...], small: tuple[int, ...]) -> int | None:
    dims = [d for d, (a, b) in enumerate(zip(big, small, strict=True)) if a != b]
    if len(dims) > 1:
        raise UnsupportedError(
            f"Pipeline: a value of the layer loop of shape {big} shrinks on dims {dims} "
            "with the microbatch; Pipeline needs one batch dim"
        )
    return dims[0] if dims else None


def _check_layerwise(
    full: ClosedJaxpr, local: ClosedJaxpr, forward: int, backward: int
) -> dict[int, str]:
    """Outside the loops, an op reading a stacked value must keep its layers
    apart (`partir.pipeline.apart`): each stage runs it on its own. In the
    update a reduction over the layers is allowed (a stage reduces its own, the
    stages' partials combine); returns those, by how they combine."""
    across: dict[int, str] = {}
    for i, (a, b) in enumerate(zip(full.jaxpr.eqns, local.jaxpr.eqns, strict=True)):
        if i in (forward, backward):
            continue
        operands = [cut_dims(x, y) for x, y in zip(a.invars, b.invars, strict=True)]
        results = [cut_dims(x, y) for x, y in zip(a.outvars, b.outvars, strict=True)]
        if not any(operands):
            if makes_along_cut(a, results):
                raise UnsupportedError(
                    f"Pipeline: `{a.primitive.name}` outside the layer loop makes a value "
                    "along the layers (random bits, or an iota over them): a stage would "
                    "get the first layers' values rather than its own; make it inside the "
                    "loop, or from a stacked argument"
                )
            continue
        kept = keeps_apart(a, operands, results)
        if kept == ACROSS and i > backward:
            across[i] = LAYER_REDUCTIONS[a.primitive.name]
        elif kept is not True:
            raise UnsupportedError(
                f"Pipeline: `{a.primitive.name}` outside the layer loop combines the layers "
                "of a stacked value (it reads other layers than the one it makes, or none); "
                "each stage holds only its own layers, so compute it per layer or inside "
                "the loop (a sum, max or min over the layers in the update, such as a "
                "global gradient norm, is supported)"
            )
    return across


def _check_rows_apart(
    s: StepStructure, axis: str, probe: ClosedJaxpr, loops: tuple[int, int]
) -> None:
    """Microbatching keeps the step's meaning only if the layer loops treat
    each example apart (the backward may sum over them, into the gradients
    that add up over microbatches anyway), and the gradient the head hands the
    backward loop for an example reads that example's output alone
    (`partir.pipeline.apart`: the stage-local trace against `probe`, the same
    traced with fewer rows, its loops at `loops`)."""
    here = f"Pipeline({quoted(axis)})"
    for index, probe_index in zip((s.forward, s.backward), loops, strict=True):
        big, small = s.local.jaxpr.eqns[index], probe.jaxpr.eqns[probe_index]
        states, first = reads_across(big.params["jaxpr"].jaxpr, small.params["jaxpr"].jaxpr)
        for j, state in enumerate(states):
            summed = index == s.backward and (index, j) not in s.result_batch_dim
            if state == MIXED or (state == SUMMED and not summed):
                raise PipelineError(
                    f"{here}: the layer loop reads across the examples of the batch "
                    f"(`{first or 'a sum over them'}`: a batch statistic, or random numbers "
                    "drawn for the whole batch such as a dropout mask), so one microbatch at a "
                    "time would give another result; keep each example apart inside the loop "
                    "(normalise over features; draw per-example randomness outside it), or "
                    "partition without Pipeline"
                )
    head = s.local.jaxpr.eqns[s.forward + 1 : s.backward]
    micro_head = probe.jaxpr.eqns[loops[0] + 1 : loops[1]]
    made = {v for eqn in head for v in eqn.outvars}
    handed = [v for v in s.backward_eqn.invars if isinstance(v, Var) and v in made]
    states, first = reads_across_eqns(head, micro_head, handed)
    if any(state != CLEAN for state in states):
        raise PipelineError(
            f"{here}: the gradient the loss hands the layer loop for one example reads "
            f"other examples (`{first or 'a sum over them'}`: a contrastive loss, or a loss "
            "scaled by a batch statistic), so it cannot be taken one microbatch at a "
            "time; make each example's loss term depend on that example alone, or "
            "partition without Pipeline"
        )


def _check_carries(s: StepStructure, axis: str) -> None:
    eqn = s.forward_eqn
    for k in s.carries(eqn):
        aval: Any = eqn.invars[k].aval
        if (s.forward, k) not in s.operand_batch_dim:
            raise UnsupportedError(
                f"Pipeline({quoted(axis)}): the layer loop carries a value of shape "
                f"{tuple(aval.shape)} without a batch dim besides its "
                "activation; carry per-example values only"
            )
