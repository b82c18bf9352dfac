"""The flagship demo: import a transformer training step and check it on numbers.

Imports example (d) (a GPT-2 block's `value_and_grad` + Adam step) through
JAX's StableHLO, prints the imported IR, runs partir's reference interpreter
on it and compares every output leaf with `jax.jit` of the same function.
"""

from __future__ import annotations

import os
import time

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import jax
import numpy as np

import partir
from dialects.interpreter import run_function
from examples import block_train_step


def main() -> int:
    args = block_train_step.make_args()
    start = time.perf_counter()
    module = partir.import_jax(block_train_step.program, *args)
    module.verify()
    imported = time.perf_counter() - start
    print(module)
    ops = sum(1 for _ in module.walk())

    start = time.perf_counter()
    got = run_function(module, jax.tree_util.tree_leaves(args))
    interpreted = time.perf_counter() - start
    ref = jax.tree_util.tree_leaves(jax.jit(block_train_step.program)(*args))
    paths = [
        jax.tree_util.keystr(p)
        for p, _ in jax.tree_util.tree_flatten_with_path(
            jax.jit(block_train_step.program).eval_shape(*args)
        )[0]
    ]

    worst, failures = 0.0, []
    for path, g, r in zip(paths, got, ref, strict=True):
        r = np.asarray(r)
        scale = float(np.abs(r).max()) or 1.0
        err = float(np.abs(g.astype(np.float64) - r).max()) / scale
        worst = max(worst, err)
        if g.shape != r.shape or g.dtype != r.dtype or err > 1e-5:
            failures.append(f"  result{path}: relative error {err:.2e}")
    print(
        f"\nimported {ops} ops in {imported:.2f}s; interpreted in {interpreted:.2f}s; "
        f"{len(ref)} result leaves, worst error {worst:.1e} of max|ref|"
    )
    if failures:
        print("MISMATCH against jax.jit:\n" + "\n".join(failures))
        return 1
    print("interpreter matches jax.jit on every leaf")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
