"""Pipeline parallelism on the IR: a step's layer loops split over a mesh axis
into stages that pass microbatches to their neighbours (`partir.Pipeline`).

- `tactic`: the Pipeline tactic (the step partitioned per microbatch);
- `layer_loops`, `stage_loops`: the layer loops found and split into stages;
- `schedule`: the schedules as tables (GPipe, 1F1B, interleaved 1F1B);
- `program`, `builder`: the per-microbatch SPMD program scheduled over time.
"""
