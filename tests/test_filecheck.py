"""The lit + FileCheck suite in tests/filecheck, one pytest test per .mlir file.

Each test runs `lit -v <file>` with this interpreter's lit, so `make test`
(pytest) runs the suite and reports it in pytest's summary. A lit XFAIL (a
known bug, described by the file's `// BUG:` line) shows as xfailed; a test
whose `REQUIRES:` is not met shows as skipped.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SUITE = ROOT / "tests" / "filecheck"
FILES = sorted(SUITE.rglob("*.mlir"))

HAVE_LIT = importlib.util.find_spec("lit") is not None
HAVE_FILECHECK = importlib.util.find_spec("filecheck") is not None
needs_lit = pytest.mark.skipif(
    not (HAVE_LIT and HAVE_FILECHECK),
    reason="lit and filecheck are not installed (pip install -e '.[test]')",
)


def lit_command() -> list[str]:
    script = shutil.which("lit", path=os.path.dirname(sys.executable))
    if script:
        return [script]
    return [sys.executable, "-c", "import lit.main; lit.main.main()"]


def bug_note(path: Path) -> str:
    match = re.search(r"^// BUG: (.*)$", path.read_text(), flags=re.M)
    return match.group(1) if match else "lit XFAIL"


@needs_lit
@pytest.mark.parametrize("path", FILES, ids=[str(p.relative_to(SUITE)) for p in FILES])
def test_lit(path: Path) -> None:
    proc = subprocess.run(
        [*lit_command(), "-v", "--no-progress-bar", str(path)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    output = proc.stdout + proc.stderr
    name = path.relative_to(SUITE).as_posix()
    if re.search(rf"^XPASS: .* :: {re.escape(name)}", output, flags=re.M):
        pytest.fail(f"{name} is marked XFAIL ({bug_note(path)}) but passes: "
                    "the bug is fixed, remove its `// XFAIL:` and `// BUG:` lines")
    assert proc.returncode == 0, f"lit failed on {path.relative_to(ROOT)}:\n{output}"
    if re.search(rf"^XFAIL: .* :: {re.escape(name)}", output, flags=re.M):
        pytest.xfail(f"known bug: {bug_note(path)}")
    if re.search(rf"^UNSUPPORTED: .* :: {re.escape(name)}", output, flags=re.M):
        pytest.skip(f"lit: a REQUIRES of {name} is not met")
    assert re.search(rf"^PASS: .* :: {re.escape(name)}", output, flags=re.M), output


def test_suite_is_not_empty() -> None:
    assert len(FILES) >= 20, FILES


def test_example_mlir_files_are_up_to_date() -> None:
    """examples/*.mlir (the lit tests' inputs) are what export_mlir generates."""
    from examples.export_mlir import EXPORTED, stablehlo_text

    for name in EXPORTED:
        path = ROOT / "examples" / f"{name}.mlir"
        assert path.read_text() == stablehlo_text(name), (
            f"{path.relative_to(ROOT)} is out of date: run python -m examples.export_mlir"
        )
