"""benchmarks/gpu_check.py runs where CI runs (the CPU): every row's numbers
are jax.jit's, its HLO census is jax.jit's, and the calibrated profile
predicts a positive step (on a GPU the same script checks the speed)."""

from __future__ import annotations

import re

import pytest

from benchmarks import gpu_check


@pytest.mark.slow
def test_the_gpu_check_runs_on_the_cpu(capsys):
    rows = gpu_check.main(["--quick", "--rounds", "1"])
    assert [(r.name, r.dtype) for r in rows] == [
        (name, dtype) for dtype in ("float32", "bfloat16") for name in gpu_check.ROWS
    ]
    for r in rows:
        assert r.max_diff <= (1e-5 if r.dtype == "float32" else 1e-2), r
        assert r.predicted_ms > 0 and r.partir_ms > 0 and r.jit_ms > 0
        ours, theirs = (
            dict(re.findall(r"(\w+) (\d+)", census)) for census in (r.partir_census, r.jit_census)
        )
        assert ours["coll"] == "0"
        for op in ("T", "C"):
            assert abs(int(ours[op]) - int(theirs[op])) <= 2, (r.name, ours, theirs)
    out = capsys.readouterr().out
    assert "links: none" in out and "| block step ZeRO-3 | bfloat16 |" in out
