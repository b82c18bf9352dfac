"""The JAX devices a partir `Mesh` runs on (`devices_for`).

The compiler tools load this module (`partir-opt --check-numerics` runs the
emitted program), and they start without JAX: JAX is imported on use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from dialects.errors import PartirValueError
from partir.mesh import Mesh

if TYPE_CHECKING:
    import jax


def devices_for(mesh: Mesh, jax_mesh: jax.sharding.Mesh | None) -> jax.sharding.Mesh:
    """The JAX mesh to run on: the one given, or the first devices, row-major."""
    import jax

    for axis in mesh.axes if jax_mesh is None else jax_mesh.axis_names:
        if not isinstance(axis, str) or not axis.isascii() or "\\" in axis:
            raise PartirValueError(
                f"mesh axis {axis!r} cannot run on JAX: XLA aborts the process on axis "
                "names with non-ASCII characters or backslashes; rename the axis "
                "(the IR stages and emitted source take any name)"
            )
    if jax_mesh is not None:
        return jax_mesh
    devices = jax.devices()
    if mesh.size > len(devices):
        raise PartirValueError(
            f"the mesh {mesh.axes} needs {mesh.size} devices, but jax.devices() has "
            f"{len(devices)} ({devices[0].platform}); on CPU set "
            f"XLA_FLAGS=--xla_force_host_platform_device_count={mesh.size} before importing jax"
        )
    grid = np.array(devices[: mesh.size]).reshape(tuple(mesh.axes.values()))
    return jax.sharding.Mesh(grid, tuple(mesh.axes), axis_types=_axis_types(mesh))


def _axis_types(mesh: Mesh) -> tuple[jax.sharding.AxisType, ...]:
    """Auto axes, or the axis types of the mesh `jax.set_mesh` holds where it
    is this mesh (explicit mode): `shard_map` refuses a mesh whose axis types
    differ from the context's."""
    import jax

    context = jax.sharding.get_abstract_mesh()
    names = tuple(getattr(context, "axis_names", ()))
    sizes = tuple(getattr(context, "axis_sizes", ()))
    if names == tuple(mesh.axes) and sizes == tuple(mesh.axes.values()):
        return tuple(context.axis_types)
    return (jax.sharding.AxisType.Auto,) * len(mesh.axes)
