"""`partir-opt`: run partir's passes over MLIR text, in the manner of `mlir-opt`.

    partir-opt block.mlir -p 'partir-declare-mesh{axes="batch=4,model=2"},\\
        partir-batch-parallel{axis=batch},partir-megatron{axis=model},partir-lower-spmd'
    partir-opt step.mlir -p '...,partir-lower-spmd,partir-emit-jax' -o step.py

It is xDSL's `xdsl-opt` driver with partir's dialects (StableHLO with its gaps
closed, CHLO, partir core, SPMD), partir's parser (hex float literals read as
MLIR does), every pass of `partir.passes.PASSES` next to xDSL's own, and a
`jax` target: when `partir-emit-jax` ends the pipeline, the output is the
Python module. Errors print one clear message and exit with status 1;
`--traceback` shows the Python traceback instead.
"""

from __future__ import annotations

import argparse
import re
import sys
import textwrap
from collections.abc import Sequence
from dataclasses import MISSING, fields
from typing import IO

from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import ModulePass
from xdsl.universe import Universe
from xdsl.utils.exceptions import DiagnosticException, ParseError, PassFailedException
from xdsl.xdsl_opt_main import xDSLOptMain

from dialects.context import DIALECTS
from dialects.parser import PartirParser
from lowering.to_jax import emit_jax
from partir.passes import PASSES, EmitJaxPass

DESCRIPTION = "partir-opt: partition StableHLO programs over a device mesh (xdsl-opt driver)"


def _option_text(pass_class: type[ModulePass]) -> str:
    opts = []
    for f in fields(pass_class):  # type: ignore[arg-type]
        if not f.init:
            continue
        if f.default is MISSING:
            default = "required"
        elif f.default is None:
            default = "none"
        else:
            default = f.default
        opts.append(f"{f.name.replace('_', '-')}={default}")
    return "{" + " ".join(opts) + "}" if opts else ""


def pass_help() -> str:
    """The --help section listing partir's passes, options and purpose."""
    lines = ["partir passes (options with defaults; any xdsl-opt pass also works):"]
    for name, factory in PASSES.items():
        cls = factory()
        doc = (cls.__doc__ or "").strip().splitlines()[0]
        lines.append(f"  {name}{_option_text(cls)}")
        lines += textwrap.wrap(doc, 76, initial_indent="      ", subsequent_indent="      ")
    return "\n".join(lines)


class PartirOptMain(xDSLOptMain):
    """xDSL's optimizer driver, with partir's dialects, parser, passes and target."""

    def register_all_dialects(self) -> None:
        ours = {d.name: d for d in DIALECTS}
        for name, factory in Universe.get_multiverse().all_dialects.items():
            if name not in ours:
                self.ctx.register_dialect(name, factory)
        for dialect in DIALECTS:
            self.ctx.load_dialect(dialect)

    def register_all_frontends(self) -> None:
        def parse_mlir(io: IO[str]) -> ModuleOp:
            text = io.read()
            return PartirParser(self.ctx, text, self.get_input_name()).parse_module(
                not self.args.no_implicit_module
            )

        self.available_frontends["mlir"] = parse_mlir

    def register_all_passes(self) -> None:
        super().register_all_passes()
        for name, factory in PASSES.items():
            self.register_pass(name, factory)

    def register_all_targets(self) -> None:
        super().register_all_targets()

        def jax_target(module: ModuleOp, output: IO[str]) -> None:
            last = self.pipeline.passes[-1] if self.pipeline.passes else None
            output.write(last.source if isinstance(last, EmitJaxPass) else emit_jax(module))

        self.available_targets["jax"] = jax_target

    def register_all_arguments(self, arg_parser: argparse.ArgumentParser) -> None:
        super().register_all_arguments(arg_parser)
        arg_parser.formatter_class = argparse.RawDescriptionHelpFormatter
        arg_parser.epilog = pass_help()
        arg_parser.add_argument(
            "--print-ir-after-all",
            action="store_true",
            help="print the IR after every pass (including the last) to stderr",
        )
        arg_parser.add_argument(
            "--check-numerics",
            action="store_true",
            help="run the module before and after every pass on the reference interpreters "
            "(seeded random inputs; after partir-emit-jax the emitted program, on JAX) and stop "
            "at the first pass that changes the numbers",
        )
        arg_parser.add_argument(
            "--traceback",
            action="store_true",
            help="on an error, show the Python traceback instead of one message",
        )

    def setup_pipeline(self) -> None:
        super().setup_pipeline()
        passes = self.pipeline.passes
        if passes and passes[-1].name == "partir-emit-jax" and self.args.target == "mlir":
            self.args.target = "jax"
        if self.args.print_ir_after_all:
            inner = self.pipeline.callback

            def dump(done, module, following) -> None:
                if inner is not None:
                    inner(done, module, following)
                if done is not None:
                    print(f"// -----// IR after {done.name} //----- //", file=sys.stderr)
                    print(str(module), file=sys.stderr)

            self.pipeline = type(self.pipeline)(passes, dump)
        if self.args.check_numerics:
            from partir.validation import checking_numerics

            self.pipeline = checking_numerics(self.pipeline)


def _failing_op(notes: Sequence[str]) -> str:
    """The op line xDSL marks with `^^^` in the annotated IR of a diagnostic."""
    for note in notes:
        lines = note.splitlines()
        for i, line in enumerate(lines[1:], start=1):
            if re.fullmatch(r"\s*\^+-*\s*", line):
                return lines[i - 1].strip()
    return ""


def _message(err: BaseException) -> str:
    if isinstance(err, ParseError):
        return str(err).rstrip()
    text = str(err).splitlines()[0] if str(err) else type(err).__name__
    if isinstance(err, DiagnosticException):
        op = _failing_op(getattr(err, "__notes__", ()))
        return f"error: {text}" + (f"\n  in: {op[:200]}" if op else "")
    if text.startswith("Unrecognized passes"):
        ours = ", ".join(PASSES)
        return f"error: {text}\n  partir's passes: {ours}\n  (partir-opt --help lists all)"
    return f"error: {text}"


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    show_traceback = "--traceback" in args
    try:
        PartirOptMain(description=DESCRIPTION, args=args).run()
    except SystemExit:
        raise
    except (
        ParseError,
        DiagnosticException,
        PassFailedException,
        ValueError,
        OSError,
        NotImplementedError,
        KeyError,
    ) as err:
        if show_traceback:
            raise
        print(_message(err), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
