"""partir: partition JAX programs across a device mesh, PartIR style.

Names are imported on first use, so tools that need only the compiler
(`partir-opt`, `partir-inspect`) do not pay for importing JAX.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "BatchParallel": "partir.tactics",
    "ManualPartition": "partir.tactics",
    "Megatron": "partir.tactics",
    "Tactic": "partir.tactics",
    "TacticError": "partir.tactics",
    "ZeRO": "partir.tactics",
    "Mesh": "partir.mesh",
    "Partitioned": "partir.partition",
    "partition": "partir.partition",
    "import_jax": "partir.importer",
    "Compiled": "partir.api",
    "Lowered": "partir.api",
    "PartitionedFunction": "partir.api",
    "jit": "partir.api",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'partir' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
