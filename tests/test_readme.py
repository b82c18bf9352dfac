"""The README's examples run as written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_the_python_example_runs(capsys):
    (block, *_) = python_blocks()
    namespace: dict[str, object] = {"__name__": "readme_example"}
    exec(compile(block, str(README), "exec"), namespace)
    out = capsys.readouterr().out
    assert "partir.loop" in out and "spmd.all_reduce" in out and "jax.shard_map" not in out
    assert namespace["lowered"].source_path.exists()  # type: ignore[attr-defined]


def test_the_nnx_example_runs_with_jax_jit_s_numbers(capsys):
    """The Flax NNX section's step, partitioned as written: `jax.jit`'s
    loss and state (RNG keys included), and the tactic lines it shows."""
    pytest.importorskip("flax.nnx", reason="the NNX example needs flax")
    import jax
    import numpy as np

    from partir.keys import KeyBoundary
    from tests.numerics import assert_leaves_close

    text = subsection("### Flax NNX")
    (block,) = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    model_and_step, partitioned = block.split("\nmesh = ")
    namespace: dict[str, object] = {"__name__": "readme_nnx"}
    exec(compile(model_and_step, str(README), "exec"), namespace)
    x, y = np.random.default_rng(0).standard_normal((2, 8, 4, 16), dtype=np.float32)
    want = jax.jit(namespace["step"])(namespace["state"], x, y)  # before nnx.update
    exec(compile("mesh = " + partitioned, str(README), "exec"), namespace)

    def raw(tree: object) -> list[object]:
        return jax.tree.leaves(KeyBoundary.of((tree,)).raw((tree,)))

    got = (namespace["loss"], namespace["new_state"])
    assert_leaves_close(raw(got), raw(want), what="README NNX step")
    printed = capsys.readouterr().out.splitlines()
    (shown,) = re.findall(r"\n\n```\n(.*?)```", text, flags=re.S)
    assert len(printed) == len(shown.splitlines())
    for line, pattern in zip(printed, shown.splitlines(), strict=True):
        assert re.fullmatch(".*".join(map(re.escape, pattern.split("..."))), line), line


def subsection(heading: str) -> str:
    """The text under `heading` (its `#`s included), to the next heading."""
    match = re.search(rf"^{heading}\n(.*?)(?=^#)", README.read_text(), flags=re.M | re.S)
    assert match, f'README.md has no "{heading}"'
    return match.group(1)


def section(title: str) -> str:
    match = re.search(rf"^## {title}\n(.*?)(?=^## )", README.read_text(), flags=re.M | re.S)
    assert match, f'README.md has no "## {title}" section'
    return match.group(1)


def test_the_onnx_section_runs_both_ways(tmp_path, monkeypatch):
    """Export (checker, onnxruntime against jax.jit, re-import to the same
    collectives) in Python, then the CLI command, each as written."""
    import os
    import shlex
    import subprocess
    import sys

    import onnx

    text = section("ONNX")
    (block,) = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {"__name__": "readme_onnx"}
    exec(compile(block, str(README), "exec"), namespace)
    onnx.checker.check_model(onnx.load("block.onnx"), full_check=True)
    assert namespace["again"].collectives  # type: ignore[attr-defined]

    (commands,) = re.findall(r"```sh\n(.*?)```", text, flags=re.S)
    (command,) = [c for c in commands.splitlines() if c.strip() and not c.startswith("#")]
    (tmp_path / "examples").mkdir()
    root = README.parent
    (tmp_path / "examples" / "block_forward.mlir").write_text(
        (root / "examples" / "block_forward.mlir").read_text()
    )
    os.remove("block.onnx")
    env = dict(os.environ, PATH=os.pathsep.join([os.path.dirname(sys.executable),
                                                 os.environ.get("PATH", "")]))
    proc = subprocess.run(shlex.split(command), cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    onnx.checker.check_model(onnx.load("block.onnx"), full_check=True)
