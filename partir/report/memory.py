"""Memory per device: a liveness estimate over the flat SPMD body (`estimate_memory`),
and XLA's own figures for a compiled program (`XlaMemory`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from xdsl.dialects import func
from xdsl.ir import Operation, SSAValue

from dialects.names import op_name
from dialects.spmd import FromLocalOp, ToLocalOp

if TYPE_CHECKING:
    from partir.api import Compiled


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes per device: the arguments, and a peak estimate by liveness.

    The peak is the arguments plus the largest sum, over program order of the
    flat SPMD body, of the intermediates live at one point. A value is live
    from the op defining it to its last use; values returned stay live to the
    end; `spmd.to_local`/`spmd.from_local` only rename a buffer and add
    nothing. Every op result is counted as materialised.

    XLA's number differs: it fuses elementwise chains (most intermediates of
    a layernorm or softmax never exist in memory), reuses buffers whose
    lifetimes do not overlap in its own schedule, and may alias outputs to
    inputs. So this is an upper-bound-style figure for comparing schedules
    and tactics against each other, not a prediction of XLA's allocation;
    `XlaMemory` holds XLA's own figures when a compiled program is at hand.
    """

    arguments: int
    peak_intermediates: int
    peak_at: str

    @property
    def peak(self) -> int:
        return self.arguments + self.peak_intermediates

    def to_json(self) -> dict[str, Any]:
        return {
            "arguments_bytes_per_device": self.arguments,
            "peak_intermediates_bytes_per_device": self.peak_intermediates,
            "peak_bytes_per_device": self.peak,
            "peak_at": self.peak_at,
        }


@dataclass(frozen=True)
class XlaMemory:
    """XLA's per-device figures for the compiled program (`memory_analysis()`).

    Only a compiled program has them, so a report from MLIR text never does;
    `Report.with_xla(XlaMemory.of(compiled, args))` puts them beside the
    estimate (`partir-inspect` on a file cannot show them).
    """

    arguments: int
    outputs: int
    temporaries: int
    aliased: int

    @property
    def arguments_and_temporaries(self) -> int:
        return self.arguments + self.temporaries

    @property
    def total(self) -> int:
        """Arguments, outputs and temporaries, counting aliased buffers once."""
        return self.arguments + self.outputs + self.temporaries - self.aliased

    @classmethod
    def from_stats(cls, stats: Any) -> XlaMemory:
        return cls(
            stats.argument_size_in_bytes,
            stats.output_size_in_bytes,
            stats.temp_size_in_bytes,
            stats.alias_size_in_bytes,
        )

    @classmethod
    def of(cls, compiled: Compiled, args: Sequence[Any]) -> XlaMemory:
        """Compile `compiled.run` for `args` placed as the program expects them
        (each leaf on `NamedSharding(mesh, spec)` for its `IN_SPECS` entry)."""
        import jax
        from jax.sharding import NamedSharding

        leaves = jax.tree_util.tree_leaves(args)
        specs = compiled.program.IN_SPECS
        placed = [
            jax.device_put(x, NamedSharding(compiled.jax_mesh, spec))
            for x, spec in zip(leaves, specs, strict=True)
        ]
        # `run` is jax.jit's function, or build()'s x64 wrapper with the same .lower.
        lowered = compiled.run.lower(*placed)  # type: ignore[attr-defined]  # emitted source
        return cls.from_stats(lowered.compile().memory_analysis())

    def to_json(self) -> dict[str, Any]:
        return {
            "arguments_bytes_per_device": self.arguments,
            "outputs_bytes_per_device": self.outputs,
            "temporaries_bytes_per_device": self.temporaries,
            "aliased_bytes_per_device": self.aliased,
        }


def estimate_memory(
    entry: func.FuncOp,
    bytes_of: Mapping[SSAValue, int],
    names: dict[SSAValue, str],
    materialised: Callable[[Operation], bool] | None = None,
) -> MemoryEstimate:
    """See `MemoryEstimate`: liveness over the flat SPMD body. With
    `materialised`, an op it rejects holds no buffer and its operands stay
    live until its users run (the cost model's view of XLA's fusion:
    `partir.cost.op_costs.fused`). `bytes_of` holds each value's bytes per
    device (a value it lacks holds none: not a tensor)."""
    ops = list(entry.body.block.ops)
    end = len(ops)
    position = {op: i for i, op in enumerate(ops)}
    read_at = _Reads(position, end, materialised)
    for op in reversed(ops):  # users before producers: each lookup is one level deep
        read_at(op)
    arguments = sum(bytes_of.get(a, 0) for a in entry.body.block.args)
    delta = [0] * (end + 1)
    for i, op in enumerate(ops):
        if isinstance(op, ToLocalOp | FromLocalOp):
            continue
        if materialised is not None and not materialised(op):
            continue
        for r in op.results:
            size = bytes_of.get(r)
            if size is None:
                continue
            last = max((read_at(u.operation) for u in r.uses), default=i)
            delta[i] += size
            delta[last + 1] -= size
    live, peak, peak_at = 0, 0, "no intermediates"
    for i, op in enumerate(ops):
        live += delta[i]
        if live > peak:
            peak, peak_at = live, _op_label(op, names)
    return MemoryEstimate(arguments, peak, peak_at)


class _Reads:
    """Where an op reads its operands. A fused op (one `materialised`
    rejects) runs inside its users' kernels, so it reads its operands where
    they run: a value feeding an elementwise chain that the backward pass
    recomputes stays live until then."""

    def __init__(
        self,
        position: dict[Operation, int],
        end: int,
        materialised: Callable[[Operation], bool] | None,
    ) -> None:
        self.position, self.end, self.materialised = position, end, materialised
        self.fused_reads: dict[Operation, int] = {}

    def __call__(self, user: Operation) -> int:
        if self.materialised is None or user not in self.position or self.materialised(user):
            return _last_use(user, self.position, self.end)
        found = self.fused_reads.get(user)
        if found is None:
            found = self.fused_reads[user] = max(
                (self(use.operation) for r in user.results for use in r.uses),
                default=self.position[user],
            )
        return found


def _last_use(user: Operation, position: dict[Operation, int], end: int) -> int:
    """Where a use ends: at its top-level op; a result (`from_local`) at the end."""
    while user not in position and (parent := user.parent_op()) is not None:
        user = parent
    if isinstance(user, FromLocalOp | func.ReturnOp):
        return end - 1
    return position.get(user, end - 1)


def _op_label(op: Operation, names: dict[SSAValue, str]) -> str:
    return f"{names.get(op.results[0], '?')} ({op_name(op)})" if op.results else op_name(op)
