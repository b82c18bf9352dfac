"""XLA's own memory figures for a compiled program (`XlaMemory`), beside
partir's liveness estimate (`partir.cost.memory.MemoryEstimate`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol


class CompiledProgram(Protocol):
    """What `XlaMemory.of` reads of a compiled program (`partir.lowered.Compiled`)."""

    program: Any
    jax_mesh: Any
    run: Any


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
    def of(cls, compiled: CompiledProgram, args: Sequence[Any]) -> XlaMemory:
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
        lowered = compiled.run.lower(*placed)  # the emitted source's
        return cls.from_stats(lowered.compile().memory_analysis())

    def to_json(self) -> dict[str, Any]:
        return {
            "arguments_bytes_per_device": self.arguments,
            "outputs_bytes_per_device": self.outputs,
            "temporaries_bytes_per_device": self.temporaries,
            "aliased_bytes_per_device": self.aliased,
        }
