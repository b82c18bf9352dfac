"""partir: partition JAX programs across a device mesh, PartIR style."""

from partir.importer import import_jax
from partir.mesh import Mesh
from partir.partition import Partitioned, partition
from partir.tactics import BatchParallel, ManualPartition, Megatron, Tactic, TacticError, ZeRO

__all__ = [
    "BatchParallel",
    "ManualPartition",
    "Megatron",
    "Mesh",
    "Partitioned",
    "Tactic",
    "TacticError",
    "ZeRO",
    "import_jax",
    "partition",
]
