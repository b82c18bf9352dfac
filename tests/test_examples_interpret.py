"""Every example program, interpreted, computes what XLA computes."""

from __future__ import annotations

import importlib
from typing import Any

import jax
import numpy as np
import pytest

import examples
import partir
from dialects.interpreter import run_function
from tests.numerics import assert_close

CASES = [pytest.param(name, {}, id=name) for name in examples.ALL] + [
    pytest.param("transformer_stack", {"layers_": 24}, id="transformer_stack-24-layers"),
]


@pytest.mark.parametrize(("name", "arg_options"), CASES)
def test_example_interprets_like_xla(name: str, arg_options: dict[str, Any]):
    example = importlib.import_module(f"examples.{name}")
    args = example.make_args(**arg_options)
    module = partir.import_jax(example.program, *args)
    module.verify()
    got = run_function(module, jax.tree_util.tree_leaves(args))
    want = jax.tree_util.tree_leaves(jax.jit(example.program)(*args))
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert_close(g, np.asarray(w), what=f"{name} result {i}")
