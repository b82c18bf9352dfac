# ruff: noqa: F821  (lit provides `config`)
# lit configuration for partir's FileCheck tests (xDSL's conventions).
#
#   .venv/bin/lit -v tests/filecheck            # all of them
#   .venv/bin/lit -v tests/filecheck/passes/zero.mlir
#   .venv/bin/python -m pytest tests/test_filecheck.py   # the same, one pytest test per file
#
# RUN lines may use:
#   partir-opt, partir-inspect   partir's CLIs, run by the interpreter that runs lit
#   filecheck                    the FileCheck clone xDSL uses (filecheck==1.0.6)
#   PARTIR_ROUNDTRIP             print generic, re-parse, print custom, filecheck %s
#   %examples                    the examples/ folder (examples/*.mlir: StableHLO stage)
#   %python                      the Python interpreter
import hashlib
import os
import shutil
import sys
import tempfile

import lit.formats

config.name = "partir"
config.test_format = lit.formats.ShTest(execute_external=False)
config.suffixes = [".mlir"]
config.test_source_root = os.path.dirname(os.path.abspath(__file__))
repo = os.path.dirname(os.path.dirname(config.test_source_root))
python = sys.executable
bin_dir = os.path.dirname(python)

# Temporary files (%t) go outside the source tree, one folder per checkout.
config.test_exec_root = os.environ.get("PARTIR_LIT_EXEC_ROOT") or os.path.join(
    tempfile.gettempdir(),
    f"partir-lit-{os.getuid()}-{hashlib.sha1(repo.encode()).hexdigest()[:8]}",
)


def tool(name, module):
    """The console script next to the interpreter, else `python -m module`."""
    found = shutil.which(name, path=bin_dir)
    return found if found else f"{python} -m {module}"


# Substitutions are applied in list order, before lit's own (%s, %t, ...):
# PARTIR_ROUNDTRIP expands to `partir-opt` and `filecheck`, so it comes first.
config.substitutions.append((
    "PARTIR_ROUNDTRIP",
    "partir-opt %s --print-op-generic --split-input-file"
    " | partir-opt --split-input-file | filecheck %s",
))
config.substitutions.append(("partir-opt", f"{python} -m partir.opt"))
config.substitutions.append(("partir-inspect", f"{python} -m partir.inspect"))
config.substitutions.append(("filecheck", tool("filecheck", "filecheck")))
config.substitutions.append(("%examples", os.path.join(repo, "examples")))
config.substitutions.append(("%python", python))

if os.path.exists(os.path.join(repo, "partir", "inspect.py")):
    config.available_features.add("partir-inspect")

config.environment["PATH"] = os.pathsep.join([bin_dir, os.environ.get("PATH", "")])
config.environment["PYTHONPATH"] = repo
config.environment["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
config.environment["JAX_PLATFORMS"] = "cpu"
