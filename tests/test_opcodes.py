"""`benchmarks/opcodes.py` counts the Python opcodes a stage runs: a measure
of work that, unlike the clock on a shared host (±20%), moves by a few in
100,000 between runs (sets ordered by address take their branches in
another order)."""

from __future__ import annotations

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import partir
from benchmarks.opcodes import opcodes
from examples import mlp_forward


def _loop(n: int) -> int:
    total = 0
    for i in range(n):
        total += i
    return total


def test_opcodes_are_counted_per_function_and_grow_with_the_work():
    result, small = opcodes(lambda: _loop(10))
    _, large = opcodes(lambda: _loop(1000))
    assert result == 45
    (code,) = [c for c in small if c.co_name == "_loop"]
    assert 0 < small[code] < large[code] < 200 * small[code]


def test_a_partition_runs_nearly_the_same_opcodes_every_time():
    args = mlp_forward.make_args()
    mesh = partir.Mesh({"batch": 4, "model": 2})
    tactics = [partir.BatchParallel("batch"), partir.Megatron("model")]
    module = partir.import_jax(mlp_forward.program, *args)
    partir.partition(module.clone(), mesh, tactics)  # the memos a first run fills

    def counted() -> int:
        copy = module.clone()
        return sum(opcodes(lambda: partir.partition(copy, mesh, tactics))[1].values())

    counts = [counted(), counted()]
    assert counts[0] > 0 and abs(counts[0] - counts[1]) <= counts[0] // 1000, counts
