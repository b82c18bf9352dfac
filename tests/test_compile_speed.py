"""`benchmarks/compile_speed.py`'s anchor: XLA's own Shardy propagation time,
read from XLA's per-pass log. The benchmark itself is not a test (it runs for
minutes); this checks, cheaply, that jax 0.10.2 on CPU still writes that log
with the flags the benchmark sets and that the reader finds the pass in it.
"""

from __future__ import annotations

import os
import subprocess
import sys

from benchmarks.compile_speed import SHARDY_PASS, pass_seconds

PROGRAM = """
import jax, jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P
mesh = jax.make_mesh((4, 2), ("rows", "cols"))
def two_layers(w, v, x):
    return jnp.tanh(jnp.tanh(x @ w) @ v).sum()
shardings = (NamedSharding(mesh, P(None, "cols")), NamedSharding(mesh, P("cols", None)),
             NamedSharding(mesh, P("rows")))
jax.jit(jax.grad(two_layers), in_shardings=shardings).lower(
    jnp.ones((16, 32)), jnp.ones((32, 8)), jnp.ones((8, 16))).compile()
"""


def test_shardy_propagation_time_is_read_from_xla_pass_log():
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "0", "TF_CPP_VMODULE": "hlo_pass_pipeline=1"}
    run = subprocess.run([sys.executable, "-c", PROGRAM], env=env, check=True,
                         capture_output=True, text=True)
    assert f"HLO pass: {SHARDY_PASS} time:" in run.stderr
    seconds = pass_seconds(run.stderr, "jit_two_layers")
    assert 0 < seconds < 60, seconds
    assert pass_seconds(run.stderr, "jit_no_such_module") == 0


def test_pass_times_belong_to_the_module_whose_pipeline_runs_them():
    log = "\n".join([
        "I hlo_pass_pipeline.cc:303] Running HLO pass pipeline on module jit_a: sharding-removal",
        "I hlo_pass_pipeline.cc:176] HLO pass: shardy-xla time: 8 us (8 us) (cumulative: 8 us)",
        "I hlo_pass_pipeline.cc:303] Running HLO pass pipeline on module jit_b: spmd-partitioner",
        "I hlo_pass_pipeline.cc:176] HLO pass: shardy-xla time: 1.5 s (1500000 us) (cumulative",
        "I hlo_pass_pipeline.cc:176] HLO pass: sharding-remover time: 9 us (9 us) (cumulative",
        "I hlo_pass_pipeline.cc:303] Running HLO pass pipeline on module jit_a: spmd-partitioner",
        "I hlo_pass_pipeline.cc:176] HLO pass: shardy-xla time: 54.3 ms (54257 us) (cumulative",
    ])
    assert pass_seconds(log, "jit_a") == (8 + 54257) / 1e6
    assert pass_seconds(log, "jit_b") == 1.5
    assert pass_seconds(log, "jit_b", "sharding-remover") == 9 / 1e6
