"""Pipeline parallelism: a step's layer loop split over a mesh axis into stages
that pass microbatches to their neighbours (`partir.Pipeline`).

- `schedule`: the schedules as tables (GPipe, 1F1B);
- `structure`: the step's loops and segments, read from its jaxpr;
- `engine`: the shard_map program that runs a schedule;
- `lowered`: what `partir.jit(...).lower` returns for a pipelined step.
"""
