"""The mesh value and the distribution value: what every stage reads off them."""

from __future__ import annotations

import pytest

import partir
from dialects.distribution import Distribution
from dialects.mesh import Mesh
from dialects.partir import MeshOp

MESH = Mesh({"batch": 4, "model": 2})


def test_mesh_is_its_ir_form_and_back() -> None:
    op = MESH.to_op()
    assert isinstance(op, MeshOp) and op.axes == {"batch": 4, "model": 2}
    assert op.mesh == MESH and partir.Mesh is Mesh
    assert MeshOp({}).mesh == Mesh.single_device()
    assert Mesh.single_device().size == 1 and not list(Mesh.single_device())


def test_numpy_integers_are_mesh_sizes() -> None:
    """A size read off an array's shape or a NumPy computation is an int."""
    import numpy as np

    mesh = Mesh({"batch": np.int64(4), "model": np.uint8(2)})
    assert mesh == MESH and all(type(n) is int for n in mesh.axes.values())
    assert str(mesh.to_op()) == str(MESH.to_op())


def test_mesh_sizes_and_groups_follow_jax_device_order() -> None:
    assert (MESH.size, MESH.size_of(["model"]), MESH.size_of(("batch", "model"))) == (8, 2, 8)
    assert MESH["batch"] == 4 and dict(MESH) == {"batch": 4, "model": 2}
    # Row-major: device 3 is batch=1, model=1.
    assert MESH.devices[3] == {"batch": 1, "model": 1}
    assert MESH.group(3, ["model"]) == [2, 3]
    assert MESH.group(3, ["batch"]) == [1, 3, 5, 7]
    assert MESH.group_index(MESH.devices[3], ["model", "batch"]) == 1 * 4 + 1
    with pytest.raises(ValueError, match=r'Mesh\.size_of: unknown mesh axis "x"; the mesh has'):
        MESH.size_of(["x"])


def test_distribution_reads_as_distpar_properties_and_partition_specs() -> None:
    dist = Distribution((("batch", "model"), ()))
    assert dist.describe(MESH) == "batch=S(0), model=S(0)"
    assert dist.spec() == (("batch", "model"), None)
    assert dist.parts(MESH) == (8, 1)
    assert dist.block_index(MESH, 3) == (1 * 2 + 1, 0)
    partial = Distribution(((), ("batch",)), ("model",))
    assert partial.properties(MESH) == {"batch": "S(1)", "model": "P"}
    assert Distribution(((),)).describe(Mesh.single_device()) == "replicated"
    with pytest.raises(ValueError, match=r"partial over \['model'\] has no PartitionSpec"):
        partial.spec()
