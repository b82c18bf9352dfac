"""The README's examples run as written."""

from __future__ import annotations

import re
from pathlib import Path

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
