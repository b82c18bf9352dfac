"""The cost model: predict a step's time, communication and memory on a
machine described by a `Profile` (shipped, loaded from JSON, or measured
by `calibrate`), from the SPMD program alone.

- `profile`: devices and the links between them, as plain data;
- `op_costs`: FLOPs and bytes per op (the roofline's inputs);
- `collective_costs`: α-β per collective over the links its group crosses;
- `estimate`: the step, walking the SPMD program;
- `simulate`: the same from a function and abstract shapes, on any mesh;
- `calibrate`: this machine's profile, measured.
"""

from partir.cost.estimate import CollectiveEstimate, Estimate, estimate
from partir.cost.profile import Device, Link, Profile, named_profile, named_profiles
from partir.cost.simulate import simulate

__all__ = [
    "CollectiveEstimate",
    "Device",
    "Estimate",
    "Link",
    "Profile",
    "estimate",
    "named_profile",
    "named_profiles",
    "simulate",
]
