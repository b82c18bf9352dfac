"""`partir-opt`: run partir's passes over MLIR text, in the manner of `mlir-opt`.

    partir-opt block.mlir -p 'partir-declare-mesh{axes="batch=4","model=2"},\\
        partir-batch-parallel{axis=batch},partir-megatron{axis=model},partir-lower-spmd'
    partir-opt step.mlir -p '...,partir-lower-spmd,partir-emit-jax' -o step.py

It is xDSL's `xdsl-opt` driver with partir's dialects (StableHLO with its gaps
closed, CHLO, partir core, SPMD), partir's parser (hex float literals read as
MLIR does), every pass of `partir.passes.PASSES` next to xDSL's own, and a
`jax` target: when `partir-emit-jax` ends the pipeline, the output is the
Python module (and an op the emitter cannot write is refused before the first
pass, as `partir.jit` refuses it after import). `--print-debuginfo` prints
each op's location (`dialects.locations`: where the user's code made it),
which parses back and reaches the emitted program's comments. Errors print one clear
message and exit with status 1;
`--traceback` shows the Python traceback instead.
"""

from __future__ import annotations

import argparse
import difflib
import sys
import textwrap
from collections.abc import Sequence
from dataclasses import MISSING, dataclass, fields
from typing import IO, NoReturn, get_type_hints

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import ModulePass
from xdsl.targets.mlir import MLIRTarget
from xdsl.universe import Universe
from xdsl.utils.arg_spec import (  # _convert_arg_to_type: xDSL's own conversion
    ParameterListType,
    _convert_arg_to_type,
    parse_pipeline,
)
from xdsl.utils.exceptions import (
    ArgSpecParseError,
    DiagnosticException,
    ParseError,
    PassFailedException,
)
from xdsl.xdsl_opt_main import xDSLOptMain

from dialects.context import DIALECTS
from dialects.errors import PartirError, PartirValueError
from dialects.locations import LocatedPrinter
from dialects.parser import PartirParser
from lowering.emittable import refusing_unemittable
from lowering.to_jax import emit_jax
from partir.cli_errors import one_line
from partir.passes import PASSES, EmitJaxPass
from partir.validation import checking_numerics

DESCRIPTION = "partir-opt: partition StableHLO programs over a device mesh (xdsl-opt driver)"


def _option_text(pass_class: type[ModulePass]) -> str:
    opts = []
    for f in fields(pass_class):
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


@dataclass(frozen=True)
class PartirMLIRTarget(MLIRTarget):
    """xDSL's MLIR output, printing locations as partir can read them back
    (`LocatedPrinter`: none on block arguments)."""

    def emit(self, ctx: Context, module: ModuleOp, output: IO[str]) -> None:
        if self.syntax_highlight or not self.print_debuginfo:
            super().emit(ctx, module, output)
            return
        printer = LocatedPrinter(
            stream=output,
            print_generic_format=self.print_generic_format,
            print_properties_as_attributes=self.print_properties_as_attributes,
            print_debuginfo=True,
        )
        printer.print_op(module)
        printer.print_metadata(ctx.loaded_dialects)
        print("\n", file=output)


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
            if not text.strip():
                raise PartirValueError(
                    f"{self.get_input_name()} is empty; partir-opt reads MLIR ops "
                    "(a func.func, or a builtin.module holding them)"
                )
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
        self.available_targets["mlir"] = lambda: PartirMLIRTarget

    def register_all_arguments(self, arg_parser: argparse.ArgumentParser) -> None:
        super().register_all_arguments(arg_parser)

        def one_line_usage_error(message: str) -> NoReturn:
            arg_parser.exit(1, f"error: {message}; partir-opt --help lists the options\n")

        arg_parser.error = one_line_usage_error  # type: ignore[method-assign]  # xDSL builds it
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
        try:
            super().setup_pipeline()
        except ValueError as err:
            unknown = self._unknown_option()
            if unknown:  # xDSL may first say a required option is missing
                raise PartirValueError(unknown) from err
            if str(err).startswith("Incompatible types"):
                raise PartirValueError(self._bad_option()) from err
            raise
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
            self.pipeline = checking_numerics(self.pipeline)
        if any(isinstance(p, EmitJaxPass) for p in passes):
            self.pipeline = refusing_unemittable(self.pipeline)

    def _unknown_option(self) -> str | None:
        """A pass option no pass of the pipeline has (a misspelt `axs=`),
        named with the nearest option and the pass's options."""
        for spec in parse_pipeline(self.args.passes):
            factory = self.available_passes.get(spec.name)
            if factory is None:
                continue
            pass_class = factory()
            known = [f.name for f in fields(pass_class) if f.init and f.name != "name"]
            for option in spec.normalize_parameter_names().parameters:
                if option not in known:
                    near = difflib.get_close_matches(option, known, n=1)
                    guess = f" (did you mean {near[0].replace('_', '-')}?)" if near else ""
                    return (
                        f"{spec.name}: no option {option.replace('_', '-')}{guess}; "
                        f"the options are {_option_text(pass_class) or 'none'}"
                    )
        return None

    def _bad_option(self) -> str:
        """Which pass option has a value of the wrong type (xDSL's message
        names neither the pass nor the option)."""
        for spec in parse_pipeline(self.args.passes):
            factory = self.available_passes.get(spec.name)
            if factory is None:
                continue
            pass_class = factory()
            for option, value in spec.normalize_parameter_names().parameters.items():
                problem = _option_problem(pass_class, option, value)
                if problem:
                    shown = value[0] if isinstance(value, tuple) and len(value) == 1 else value
                    return (
                        f"{spec.name}: option {option.replace('_', '-')}={shown} {problem}; "
                        f"the options are {_option_text(pass_class) or 'none'}"
                    )
        return "a pass option has a value of the wrong type"


def _option_problem(
    pass_class: type[ModulePass], option: str, value: ParameterListType
) -> str | None:
    """Why `value` cannot be option `option` of `pass_class` (None if it can)."""
    try:
        _convert_arg_to_type(value, get_type_hints(pass_class)[option])
    except (ValueError, KeyError):
        wanted = get_type_hints(pass_class).get(option)
        kind = getattr(wanted, "__name__", None) or str(wanted)
        return f"needs {kind.replace('|', 'or')}"
    return None


def _message(err: BaseException, input_name: str) -> str:
    text = str(err)
    if text.startswith("Unrecognized passes"):
        ours = ", ".join(PASSES)
        return (
            f"error: {text.splitlines()[0]}; partir's passes: {ours} "
            "(partir-opt --help lists all)"
        )
    return one_line(err, input_name)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    show_traceback = "--traceback" in args
    files = [a for a in args if not a.startswith("-")]
    input_name = files[0] if files else "<stdin>"
    try:
        PartirOptMain(description=DESCRIPTION, args=args).run()
    except SystemExit:
        raise
    except (
        ParseError,
        DiagnosticException,
        PassFailedException,
        PartirError,
        ValueError,
        TypeError,
        OSError,
        NotImplementedError,
        KeyError,
        RecursionError,
        UnicodeDecodeError,
        ArgSpecParseError,
    ) as err:
        if show_traceback:
            raise
        print(_message(err, input_name), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
