"""`partir-inspect`: what a stage of partitioning did, from its MLIR text.

    partir-inspect step.spmd.mlir                  # shardings, collectives, memory
    partir-inspect step.core.mlir --format json    # the same, machine-readable
    partir-inspect import.mlir megatron.mlir       # what a tactic changed, side by side
    partir-opt ... | partir-inspect -              # read stdin
    partir-inspect --schedule 1f1b:4x8             # a pipeline schedule's timeline (4 stages, M=8)

Any stage works (import, after a tactic, SPMD): `partir.report` lowers a
core stage to read its distributions. On a terminal the tables are drawn with
rich; piped, they are plain aligned text. XLA's own memory figures need a
compiled program, so they appear only in the Python report
(`Lowered.report().with_xla(XlaMemory.of(compiled, args))`), never here.
Errors print one message and exit with status 1; `--traceback` shows the
Python traceback instead.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import NoReturn, TextIO

from rich.console import Console
from rich.table import Table as RichTable
from rich.text import Text
from xdsl.utils.exceptions import DiagnosticException, ParseError

from dialects.errors import PartirValueError
from partir.cli_errors import one_line, parse_error_line
from partir.cost.plot import plot_estimates
from partir.cost.profile import Profile
from partir.pipeline.schedule import make_schedule
from partir.report import Diff, Report, Table, build_report, diff, dumps, parse_module, render_plain


class InspectError(Exception):
    """A problem with the input, already phrased for the user."""


class _ArgumentParser(argparse.ArgumentParser):
    """argparse, with a usage error as one line and status 1 like every other error."""

    def error(self, message: str) -> NoReturn:
        self.exit(1, f"error: {message}; partir-inspect --help lists the options\n")


def _arguments() -> argparse.ArgumentParser:
    parser = _ArgumentParser(
        prog="partir-inspect",
        description="Report the shardings, collectives and memory of a partir stage, "
        "or diff two stages' shardings.",
    )
    parser.add_argument(
        "files",
        nargs="*",
        metavar="FILE",
        help="an .mlir stage ('-' reads stdin); two files: diff them",
    )
    parser.add_argument("--format", choices=("text", "json"), default="text")
    parser.add_argument(
        "--estimate",
        metavar="PROFILE",
        help="predict a step on PROFILE: a shipped profile's name "
        "(h100-8, h100-16x8, tpu-v5e-16x16) or a profile JSON file (partir.calibrate)",
    )
    parser.add_argument(
        "--plot",
        metavar="PNG",
        help="with --estimate: draw the step's time per op kind and per collective to PNG",
    )
    parser.add_argument(
        "--schedule",
        metavar="NAME:SxM[xK]",
        help="draw a pipeline schedule (gpipe, 1f1b, interleaved) of S stages, M microbatches "
        "(and K virtual stages) as a timeline, e.g. 1f1b:4x8, interleaved:4x8x2 "
        "(partir.Pipeline runs the same table)",
    )
    parser.add_argument(
        "--traceback",
        action="store_true",
        help="on an error, show the Python traceback instead of one message",
    )
    return parser


def _read(path: str) -> str:
    name = "<stdin>" if path == "-" else path
    try:
        if path == "-":
            stream = getattr(sys.stdin, "buffer", None)  # bytes, to report bad UTF-8
            return stream.read().decode("utf-8") if stream is not None else sys.stdin.read()
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError as err:
        raise InspectError(f"cannot read {path}: {err.strerror or err}") from err
    except UnicodeDecodeError as err:
        raise InspectError(one_line(err, name).removeprefix("error: ")) from err


def load_report(path: str, profile: Profile | None = None) -> Report:
    """The report of one file, or an `InspectError` saying what is wrong with it.

    The input is verified first (as `partir-opt` does): a report of IR the
    verifier rejects would describe a program that cannot exist."""
    name = "<stdin>" if path == "-" else path
    text = _read(path)
    if not text.strip():
        raise InspectError(f"{name} is empty; give a stage's MLIR text (partir-opt's output)")
    try:
        module = parse_module(text, name)
    except DiagnosticException as err:  # an attribute's own check, run while parsing
        line = one_line(err, name).removeprefix("error: ")
        raise InspectError(f"{name} does not verify: {line}") from err
    except ParseError as err:
        raise InspectError(parse_error_line(err).replace(": error: ", ": ", 1)) from err
    except RecursionError as err:
        raise InspectError(one_line(err, name).removeprefix("error: ")) from err
    try:
        module.verify()
    except DiagnosticException as err:
        line = one_line(err, name).removeprefix("error: ")
        raise InspectError(f"{name} does not verify: {line}") from err
    try:
        return build_report(module, profile=profile)
    except (ValueError, DiagnosticException) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise InspectError(f"{name}: {first}") from err


def print_tables(
    tables: Sequence[Table], out: TextIO, *, rich: bool, width: int | None = None
) -> None:
    """Rich tables on a terminal (as wide as it, unless `width`), plain
    aligned columns otherwise."""
    if not rich:
        out.write(render_plain(tables))
        return

    console = Console(file=out, force_terminal=True, width=width)
    for t in tables:
        table = RichTable(title=t.title, show_header=any(t.headers), title_justify="left")
        for header in t.headers:
            table.add_column(header)
        for row in t.rows:
            table.add_row(*(Text(cell) for cell in row))  # Text: names hold "[...]"
        console.print(table)


def _render(result: Report | Diff, fmt: str, out: TextIO) -> None:
    if fmt == "json":
        out.write(dumps(result) + "\n")
        return
    tables = result.tables() if isinstance(result, Report) else [result.table()]
    print_tables(tables, out, rich=out.isatty())
    if isinstance(result, Diff):
        out.write(result.footer + "\n")


def _profile(name: str) -> Profile:
    try:
        return Profile.load(name)
    except (PartirValueError, OSError, ValueError) as err:
        raise InspectError(f"--estimate {name}: {err}") from err


def _schedule(spec: str) -> str:
    name, _, shape = spec.partition(":")
    sizes = shape.split("x") + (["1"] if shape.count("x") == 1 else [])
    if len(sizes) != 3 or not all(n.isdigit() for n in sizes) or int(sizes[0]) < 1:
        raise InspectError(
            f"--schedule {spec!r}: write NAME:SxM with S stages and M microbatches, e.g. "
            "1f1b:4x8 (NAME:SxMxK with K virtual stages, e.g. interleaved:4x8x2)"
        )
    try:
        stages, microbatches, chunks = map(int, sizes)
        return str(make_schedule(name, stages, microbatches, chunks))
    except PartirValueError as err:
        raise InspectError(f"--schedule: {err}") from err


def run(args: argparse.Namespace, out: TextIO) -> int:
    if args.schedule:
        out.write(_schedule(args.schedule) + "\n")
        if not args.files:
            return 0
    if not args.files:
        raise InspectError("give an .mlir file to report on (or --schedule NAME:SxM)")
    if len(args.files) > 2:
        raise InspectError("give one file to report on, or two to diff")
    if args.plot and not args.estimate:
        raise InspectError("--plot draws an estimate: give --estimate PROFILE too")
    profile = _profile(args.estimate) if args.estimate else None
    reports = [load_report(path, profile) for path in args.files]
    if len(reports) == 1:
        _render(reports[0], args.format, out)
        if args.plot:
            estimate = reports[0].estimate
            assert estimate is not None
            plot_estimates({args.files[0]: estimate}, args.plot)
    else:
        labels = (args.files[0], args.files[1])
        _render(diff(reports[0], reports[1], labels), args.format, out)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = _arguments().parse_args(sys.argv[1:] if argv is None else argv)
    try:
        return run(args, sys.stdout)
    except InspectError as err:
        if args.traceback:
            raise
        print(f"error: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
