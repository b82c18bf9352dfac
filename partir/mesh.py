"""`partir.Mesh`: the mesh value, owned by `dialects/mesh.py`."""

from dialects.mesh import Mesh

__all__ = ["Mesh"]
