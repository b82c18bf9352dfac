"""The comparison every numeric test uses (see shared/guides/jax.md §4)."""

from __future__ import annotations

from typing import Any

import numpy as np


def assert_close(got: Any, ref: Any, *, what: str = "") -> None:
    """`rtol=1e-5, atol=1e-5*max|ref|` per leaf; exact for integers and booleans.

    NaNs must sit in the same places; complex values compare both parts.
    """
    got, ref = np.asarray(got), np.asarray(ref)
    assert got.shape == ref.shape, f"{what}: shape {got.shape} != {ref.shape}"
    assert got.dtype == ref.dtype, f"{what}: dtype {got.dtype} != {ref.dtype}"
    if np.iscomplexobj(ref):
        assert_close(got.real, ref.real, what=f"{what} (real part)")
        assert_close(got.imag, ref.imag, what=f"{what} (imaginary part)")
        return
    if not np.issubdtype(ref.dtype, np.inexact) and ref.dtype.kind in "biu":
        np.testing.assert_array_equal(got, ref, err_msg=what)
        return
    g, r = got.astype(np.float64), ref.astype(np.float64)
    np.testing.assert_array_equal(np.isnan(g), np.isnan(r), err_msg=f"{what}: NaNs differ")
    finite = np.isfinite(r)
    scale = float(np.abs(r[finite]).max()) if finite.any() else 0.0
    np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-5 * scale, err_msg=what, equal_nan=True)


def assert_leaves_close(got: Any, ref: Any, *, what: str = "") -> None:
    """`assert_close` leaf by leaf over two pytrees (or lists) with as many leaves."""
    import jax

    got_leaves, ref_leaves = jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(ref)
    assert len(got_leaves) == len(ref_leaves), f"{what}: {len(got_leaves)} leaves, {len(ref_leaves)} expected"
    for i, (g, r) in enumerate(zip(got_leaves, ref_leaves, strict=True)):
        assert_close(g, r, what=f"{what} leaf {i}")
