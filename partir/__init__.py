"""partir: partition JAX programs across a device mesh, PartIR style."""

from partir.api import Compiled, Lowered, PartitionedFunction, jit
from partir.importer import import_jax
from partir.mesh import Mesh
from partir.partition import Partitioned, partition
from partir.tactics import BatchParallel, ManualPartition, Megatron, Tactic, TacticError, ZeRO

__all__ = [
    "BatchParallel",
    "Compiled",
    "Lowered",
    "ManualPartition",
    "Megatron",
    "Mesh",
    "Partitioned",
    "PartitionedFunction",
    "Tactic",
    "TacticError",
    "ZeRO",
    "import_jax",
    "jit",
    "partition",
]
