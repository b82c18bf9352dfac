"""The cost model: predict a step's time, communication and memory on a
machine described by a `Profile` (shipped, loaded from JSON, or measured
by `calibrate`), from the SPMD program alone.

- `profile`: devices and the links between them, as plain data;
- `op_costs`: FLOPs and bytes per op (the roofline's inputs);
- `collective_costs`: α-β per collective over the links its group crosses;
- `estimate`: the step, walking the SPMD program (per position where devices
  run different branches by it: a pipeline's stages, and its bubble);
- `memory`: the peak per device, by liveness;
- `calibrate`: this machine's profile, measured; `machine`: the one saved.

`partir.simulate` (`partir.simulation`) runs the model on a function and
abstract shapes, on any mesh: it partitions, so it sits above this package.
"""

from partir.cost.estimate import CollectiveEstimate, Estimate, PositionTimes, estimate
from partir.cost.profile import Device, Link, Profile, named_profile, named_profiles

__all__ = [
    "CollectiveEstimate",
    "Device",
    "Estimate",
    "Link",
    "PositionTimes",
    "Profile",
    "estimate",
    "named_profile",
    "named_profiles",
]
