"""partir: partition JAX programs across a device mesh, PartIR style.

The JAX-facing names (`jit`, `import_jax`, `Lowered`, ...) are imported on
first use, so the compiler tools (`partir-opt`, `partir-inspect`) start
without importing JAX.

Inside partir, modules import one way, layer by layer: front end, planning,
cost, driver, report, api, interop (`LAYERS` in tests/test_layering.py,
which checks it).
"""

from __future__ import annotations

import importlib
from typing import Any

from dialects.errors import PartirError, PartirTypeError, PartirValueError, UnsupportedError
from partir.mesh import Mesh
from partir.partition import Partitioned, partition
from partir.pipeline.tactic import Pipeline
from partir.tactics import (
    Annotations,
    Automatic,
    BatchParallel,
    ExpertParallel,
    ManualPartition,
    Megatron,
    Tactic,
    TacticError,
    ZeRO,
)

_LAZY = {
    "import_jax": "partir.importer",
    "Compiled": "partir.api",
    "Lowered": "partir.api",
    "PartitionedFunction": "partir.api",
    "jit": "partir.api",
    "from_onnx": "partir.onnx_interop.importer",
    "ValidationError": "partir.validation",
    "Profile": "partir.cost",
    "Estimate": "partir.cost",
    "named_profile": "partir.cost",
    "simulate": "partir.simulation",
    "calibrate": "partir.cost.calibrate",
}

__all__ = [
    "Annotations",
    "Automatic",
    "BatchParallel",
    "Compiled",
    "Estimate",
    "ExpertParallel",
    "Lowered",
    "ManualPartition",
    "Megatron",
    "Mesh",
    "PartirError",
    "PartirTypeError",
    "PartirValueError",
    "Partitioned",
    "PartitionedFunction",
    "Pipeline",
    "Profile",
    "Tactic",
    "TacticError",
    "UnsupportedError",
    "ValidationError",
    "ZeRO",
    "calibrate",
    "from_onnx",
    "import_jax",
    "jit",
    "named_profile",
    "partition",
    "simulate",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'partir' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
