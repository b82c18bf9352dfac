"""One process of the multi-process pipeline test (`tests/test_pipeline.py`).

    python -m tests.pipeline_worker PROCESS_ID PROCESSES PORT

Each process has 4 CPU devices (its XLA_FLAGS); `jax.distributed` joins
them on localhost with gloo's CPU collectives into one 8-device mesh
{"stage": 4, "batch": 2}, and every process runs the same pipelined MLP
step (1F1B, 4 microbatches). It prints the loss and the sum of each stage's
updated parameters it holds, as JSON.
"""

from __future__ import annotations

import json
import sys

import jax
import numpy as np


def main(process_id: int, processes: int, port: int) -> None:
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        coordinator_address=f"localhost:{port}", num_processes=processes, process_id=process_id
    )
    import partir
    from examples import scanned_stack

    args = scanned_stack.mlp_train_args(layers_=8, batch=16)
    step = partir.jit(
        scanned_stack.mlp_train_step,
        mesh=partir.Mesh({"stage": 4, "batch": 2}),
        tactics=[partir.Pipeline("stage", 4, "1f1b"), partir.BatchParallel("batch")],
    )
    loss, params, _ = step(*args)
    mine = {
        name: {
            shard.index[0].start: float(np.asarray(shard.data, np.float64).sum())
            for shard in leaf.addressable_shards
        }
        for name, leaf in params.items()
    }
    report = {
        "devices": jax.device_count(),
        "local": jax.local_device_count(),
        "loss": float(np.asarray(loss.addressable_data(0))),
        "params": mine,
    }
    print(json.dumps(report), flush=True)
    jax.distributed.shutdown()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]))
