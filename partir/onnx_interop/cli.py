"""`partir-export-onnx`: partition a StableHLO file and write it as an annotated ONNX model.

    partir-export-onnx examples/block_forward.mlir -o block.onnx -p \\
        'partir-declare-mesh{axes="batch=4","model=2"},partir-batch-parallel{axis=batch},\\
         partir-megatron{axis=model}'

The pipeline is `partir-opt`'s (the same passes, options and errors), from
the mesh declaration through the tactics; the export lowers to SPMD itself
and writes the input program with the sharding specs the pipeline gives it
(`partir.onnx_interop.export`), as `Lowered.to_onnx` does. The file is
private to the user (0600). Errors print one line and exit with status 1.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from xdsl.dialects.builtin import ModuleOp

from dialects.errors import PartirValueError
from partir.cli_errors import one_line
from partir.generated_files import write_private
from partir.opt import PartirOptMain

DESCRIPTION = (
    "partir-export-onnx: partition StableHLO with partir-opt's passes, write annotated ONNX"
)
REFUSED = ("partir-lower-spmd", "partir-emit-jax")


def export_file(input_file: str, passes: str, output_file: str) -> Path:
    from partir.onnx_interop.export import export_module

    driver = PartirOptMain(description=DESCRIPTION, args=[input_file, "-p", passes])
    names = [p.name for p in driver.pipeline.passes]
    for refused in REFUSED:
        if refused in names:
            raise PartirValueError(
                f"partir-export-onnx: drop {refused} from the pipeline; the export lowers "
                "to SPMD itself and writes the input program with the shardings"
            )
    chunks, extension = driver.prepare_input()
    module = driver.parse_chunk(chunks[0][0], extension)
    assert isinstance(module, ModuleOp)

    def partition(replay: ModuleOp) -> None:
        driver.pipeline.apply(driver.ctx, replay)

    model = export_module(module, None, partition, name=Path(input_file).stem)
    return write_private(Path(output_file), model.SerializeToString())


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="partir-export-onnx", description=DESCRIPTION)
    parser.add_argument("input_file", help="a StableHLO .mlir file (the import stage)")
    parser.add_argument(
        "-p", "--passes", required=True,
        help="partir-opt's pipeline: partir-declare-mesh{...}, then the tactic passes",
    )
    parser.add_argument("-o", "--output-file", required=True, help="the .onnx file to write")
    parser.add_argument("--traceback", action="store_true", help="show the Python traceback")
    args = parser.parse_args(argv)
    try:
        export_file(args.input_file, args.passes, args.output_file)
    except SystemExit:
        raise
    except Exception as err:  # one line, as partir-opt prints errors
        if args.traceback:
            raise

        print(one_line(err, args.input_file), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
