"""The catalogue of bad inputs: each one, and the clear error it must give.

Four areas, one table each:

- `API_CASES`: the Python API (`partir.Mesh`, `partir.jit`, tactics,
  selectors, arguments, unsupported ops). Each raises a `partir.PartirError`
  (whose subclasses are also `ValueError`/`TypeError`) matching its pattern,
  i.e. naming the bad thing and what to do.
- `OPT_CASES`: `partir-opt` on malformed files, pipelines and options.
- `IR_CASES`: IR that breaks each verifier rule of the partir and spmd
  dialects, through `partir-opt` (the verifier runs on the parsed input).
- `INSPECT_CASES`: `partir-inspect` on bad files.

A CLI case passes when the tool exits with status 1 and writes exactly one
line to stderr, no traceback, matching its pattern (which names the option,
the op or the position). The CLIs run in-process (`main(argv)`) so the
catalogue stays fast; `test_cli_exit_status_in_a_process` checks a real
process once per tool.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import partir
from partir import inspect as inspect_cli
from partir import opt as opt_cli

# --------------------------------------------------------------------------
# The Python API

X = np.ones((8, 4), np.float32)
W = np.ones((4, 6), np.float32)
MESH = partir.Mesh({"batch": 4, "model": 2})
HERE = re.escape(Path(__file__).name)


def exp(x):
    return jnp.exp(x)


def mlp(params, x):
    return jnp.tanh(x @ params["w1"]) @ params["w2"]


PARAMS = {"w1": np.ones((4, 6), np.float32), "w2": np.ones((6, 4), np.float32)}


def lower(fn, *args, tactics=(), mesh=MESH):
    return partir.jit(fn, mesh=mesh, tactics=tactics).lower(*args)


def manual(spec, *args, fn=exp):
    return lower(fn, *(args or (X,)), tactics=[partir.ManualPartition(spec)])


def refused(fn, *args):
    """Lower `fn` with data parallelism: unsupported ops are refused first."""
    return lower(fn, *(args or (X,)), tactics=[partir.BatchParallel("batch", inputs="x")])


@dataclass(frozen=True)
class ApiCase:
    id: str
    run: Callable[[], Any]
    error: type[Exception]
    pattern: str


def _unsupported(op: str, hint: str) -> str:
    """The op (a regex), its line in this file, and the alternative."""
    return rf"{op} at \S*{HERE}:\d+:\d+.*instead, .*{re.escape(hint)}"


def _triangular_solve(x):
    return jax.scipy.linalg.solve_triangular(jnp.tril(x[:4, :4]) + 4 * jnp.eye(4), x[:4], lower=True)


def _while_callback(x):
    return jax.pure_callback(np.sin, jax.ShapeDtypeStruct(x.shape, x.dtype), x)


def _debug_print(x):
    jax.debug.print("x = {}", x)
    return x * 2


def _select_by_magnitude(x):
    """A select_and_scatter whose select is no lax comparison (JAX's own
    gradients only select with lax.ge / lax.le)."""
    from jax._src.lax.windowed_reductions import _select_and_scatter

    return _select_and_scatter(x, lambda a, b: a * a >= b * b, (1, 2), (1, 2), ((0, 0), (0, 0)),
                               x[:, :2], np.float32(0), jax.lax.add)


def _momentum(p, v, x):
    """A momentum step on one weight `[4, 8]` (its velocity `v` mirrors it)."""
    g = jax.grad(lambda p: jnp.sum(jnp.tanh(x @ p["w"])))(p)
    v = {"w": 0.9 * v["w"] + g["w"]}
    return {"w": p["w"] - 0.1 * v["w"]}, v


def _keyword_only(x, *, y):
    return x + y


API_CASES = [
    # partir.Mesh
    ApiCase("mesh-int", lambda: partir.Mesh(4), partir.PartirTypeError, r"non-empty \{axis name: size\} dict.*got 4"),
    ApiCase("mesh-empty", lambda: partir.Mesh({}), partir.PartirTypeError, r"non-empty.*got \{\}"),
    ApiCase("mesh-list", lambda: partir.Mesh([("a", 2)]), partir.PartirTypeError, r"dict.*e\.g\. partir\.Mesh"),
    ApiCase("mesh-none", lambda: partir.Mesh(None), partir.PartirTypeError, r"got None"),
    ApiCase("mesh-int-name", lambda: partir.Mesh({0: 4}), partir.PartirTypeError, r"axis names must be non-empty strings, got 0"),
    ApiCase("mesh-empty-name", lambda: partir.Mesh({"": 4}), partir.PartirTypeError, r"non-empty strings, got ''"),
    ApiCase("mesh-float-size", lambda: partir.Mesh({"a": 2.0}), partir.PartirTypeError, r"'a' needs an int size, got 2\.0 \(float\)"),
    ApiCase("mesh-str-size", lambda: partir.Mesh({"a": "4"}), partir.PartirTypeError, r"'a' needs an int size, got '4' \(str\)"),
    ApiCase("mesh-bool-size", lambda: partir.Mesh({"a": True}), partir.PartirTypeError, r"int size, got True \(bool\)"),
    ApiCase("mesh-zero-size", lambda: partir.Mesh({"a": 0}), partir.PartirValueError, r"'a' needs a positive size, got 0"),
    ApiCase("mesh-numpy-float-size", lambda: partir.Mesh({"a": np.float32(4)}), partir.PartirTypeError,
            r"'a' needs an int size, got np\.float32\(4\.0\) \(float32\)"),
    ApiCase("simulate-unknown-profile", lambda: partir.simulate(exp, (X,), {"batch": 4}, [], "h100-16x9"),
            partir.PartirValueError, r"no profile file 'h100-16x9'; the named profiles are \[.*'h100-16x8'"),
    ApiCase("mesh-negative-size", lambda: partir.Mesh({"a": -2}), partir.PartirValueError, r"positive size, got -2"),
    ApiCase("jit-mesh-int", lambda: partir.jit(exp, mesh=4), partir.PartirTypeError, r"Mesh takes"),
    ApiCase("mesh-too-big", lambda: partir.jit(exp, mesh=partir.Mesh({"a": 16}))(X), partir.PartirValueError,
            r"needs 16 devices, but jax.devices\(\) has 8.*device_count=16"),
    ApiCase("axis-xla-cannot-run", lambda: partir.jit(exp, mesh=partir.Mesh({"bätch": 4}),
            tactics=[partir.BatchParallel("bätch")])(X), partir.PartirValueError,
            r"mesh axis 'bätch' cannot run on JAX.*rename the axis"),
    ApiCase("axis-backslash-cannot-run", lambda: partir.jit(exp, mesh=partir.Mesh({"a\\b": 4}))(X),
            partir.PartirValueError, r"non-ASCII characters or backslashes"),
    # tactics=
    ApiCase("tactics-str", lambda: partir.jit(exp, mesh=MESH, tactics="batch"), partir.PartirTypeError,
            r"tactics= takes a list of tactics, got 'batch' \(str\)"),
    ApiCase("tactics-str-item", lambda: partir.jit(exp, mesh=MESH, tactics=["batch"]), partir.PartirTypeError,
            r"tactics\[0\] is 'batch' \(str\), not a partir tactic.*partir\.BatchParallel\('batch'\)"),
    ApiCase("tactics-bare", lambda: partir.jit(exp, mesh=MESH, tactics=partir.BatchParallel("batch")),
            partir.PartirTypeError, r"got the single tactic .*write tactics=\[BatchParallel"),
    ApiCase("tactics-none-item", lambda: partir.jit(exp, mesh=MESH, tactics=[None]), partir.PartirTypeError,
            r"tactics\[0\] is None \(NoneType\)"),
    ApiCase("tactics-dict", lambda: partir.jit(exp, mesh=MESH, tactics={"x": {0: "batch"}}),
            partir.PartirTypeError, r"tactics= takes a list of tactics, got \{"),
    ApiCase("tactics-class", lambda: partir.jit(exp, mesh=MESH, tactics=[partir.BatchParallel]),
            partir.PartirTypeError, r"tactics\[0\] is <class .*BatchParallel'> \(type\)"),
    ApiCase("tactics-int", lambda: partir.jit(exp, mesh=MESH, tactics=3), partir.PartirTypeError,
            r"got 3 \(int\)"),
    # BatchParallel
    ApiCase("batch-unknown-axis", lambda: lower(exp, X, tactics=[partir.BatchParallel("data")]),
            partir.TacticError, r'BatchParallel: unknown mesh axis "data"; the mesh has "batch", "model"'),
    ApiCase("batch-int-axis", lambda: lower(exp, X, tactics=[partir.BatchParallel(4)]),
            partir.PartirTypeError, r"BatchParallel: a mesh axis is named by a string, got 4 \(int\)"),
    ApiCase("batch-fewer-than-devices", lambda: lower(exp, np.ones((3, 4), np.float32), tactics=[partir.BatchParallel("batch")]),
            partir.TacticError, r'dim 0 of x \(shape \(3, 4\)\) has size 3, fewer elements than mesh axis "batch" has devices \(4\)'),
    ApiCase("batch-dim-out-of-range", lambda: lower(exp, X, tactics=[partir.BatchParallel("batch", dim=2)]),
            partir.TacticError, r"x has shape \(8, 4\), which has no dim 2"),
    ApiCase("batch-dim-str", lambda: lower(exp, X, tactics=[partir.BatchParallel("batch", dim="0")]),
            partir.PartirTypeError, r"the dim of x is '0' \(str\); dims are ints"),
    ApiCase("batch-inputs-nothing", lambda: lower(exp, X, tactics=[partir.BatchParallel("batch", inputs="y")]),
            partir.TacticError, r"BatchParallel: no argument matches 'y'; the arguments are: x"),
    ApiCase("batch-no-data", lambda: lower(lambda params: params["w1"] * 2, PARAMS, tactics=[partir.BatchParallel("batch")]),
            partir.TacticError, r"found no data arguments; name them with inputs="),
    ApiCase("batch-short-dim-0", lambda: lower(lambda x, e: x[e[0]] * 2, X, np.zeros((2, 8), np.int32),
            tactics=[partir.BatchParallel("batch")]), partir.TacticError,
            r"e\.g\. inputs=\['x'\]; e's dim 0 has 2 elements, fewer than 4 devices: add a BatchParallel "
            r"of its own with inputs=\['e'\], dim=1"),
    ApiCase("batch-scalar-only", lambda: lower(lambda x: x * 2, np.float32(3), tactics=[partir.BatchParallel("batch")]),
            partir.TacticError, r"found no data arguments"),
    # ManualPartition
    ApiCase("manual-no-match", lambda: manual({"y": {0: "batch"}}), partir.TacticError,
            r"ManualPartition: no argument matches 'y'; the arguments are: x"),
    ApiCase("manual-result-no-match", lambda: manual({"result/9": {0: "batch"}}), partir.TacticError,
            r"no result matches 'result/9'; the results are: result"),
    ApiCase("manual-dim-str", lambda: manual({"x": {"0": "batch"}}), partir.PartirTypeError,
            r"ManualPartition: the dim of x is '0' \(str\); dims are ints, e\.g\. \{0: 'batch'\}"),
    ApiCase("manual-dim-float", lambda: manual({"x": {0.0: "batch"}}), partir.PartirTypeError,
            r"the dim of x is 0\.0 \(float\)"),
    ApiCase("manual-dim-bool", lambda: manual({"x": {True: "batch"}}), partir.PartirTypeError,
            r"the dim of x is True \(bool\)"),
    ApiCase("manual-dim-out-of-range", lambda: manual({"x": {2: "batch"}}), partir.TacticError,
            r"x has shape \(8, 4\), which has no dim 2"),
    ApiCase("manual-negative-dim-out-of-range", lambda: manual({"x": {-3: "batch"}}), partir.TacticError,
            r"which has no dim -3"),
    ApiCase("manual-unknown-axis", lambda: manual({"x": {0: "bach"}}), partir.TacticError,
            r'unknown mesh axis "bach"; the mesh has "batch", "model"'),
    ApiCase("manual-axis-int", lambda: manual({"x": {0: 1}}), partir.PartirTypeError,
            r"a mesh axis is named by a string, got 1 \(int\)"),
    ApiCase("manual-axis-list", lambda: manual({"x": {0: ["batch"]}}), partir.PartirTypeError,
            r"got \['batch'\] \(list\)"),
    ApiCase("manual-fewer-than-devices", lambda: manual({"x": {1: "batch"}}, np.ones((8, 3), np.float32)),
            partir.TacticError, r'dim 1 of x \(shape \(8, 3\)\) has size 3, fewer elements than mesh axis "batch"'),
    ApiCase("manual-duplicate-axis", lambda: manual({"x": {0: "batch", 1: "batch"}}), partir.TacticError,
            r'x would be split over mesh axis "batch" on dims 0 and 1.*at most once'),
    ApiCase("manual-spec-list", lambda: manual([("x", {0: "batch"})]), partir.PartirTypeError,
            r"ManualPartition takes \{selector: \{dim: axis\}\}"),
    ApiCase("manual-dims-not-dict", lambda: manual({"x": "batch"}), partir.PartirTypeError,
            r"entry 'x': 'batch' is not selector: \{dim: axis\}"),
    ApiCase("manual-selector-int", lambda: manual({0: {0: "batch"}}), partir.PartirTypeError,
            r"entry 0: .* is not selector"),
    ApiCase("selector-nested-not-slash-key", lambda: manual({"d['a']['b']": {0: "batch"}}, {"a/b": X},
            fn=lambda d: d["a/b"] * 2), partir.TacticError,
            r"no argument matches .*d\['a'\]\['b'\].*the arguments are: d\['a/b'\]"),
    ApiCase("selector-slash-not-slash-key", lambda: manual({"d/a/b": {0: "batch"}}, {"a/b": X},
            fn=lambda d: d["a/b"] * 2), partir.TacticError, r"no argument matches 'd/a/b'"),
    ApiCase("selector-glob-too-deep", lambda: manual({"params/*/w1": {0: "batch"}}, PARAMS, X, fn=mlp),
            partir.TacticError, r"no argument matches 'params/\*/w1'; the arguments are: params/w1, params/w2, x"),
    # Megatron
    ApiCase("megatron-nothing", lambda: lower(exp, X, tactics=[partir.Megatron("model")]), partir.TacticError,
            r"Megatron: no parameter is named like a Megatron column or row weight.*column=, row="),
    ApiCase("megatron-unknown-axis", lambda: lower(mlp, PARAMS, X, tactics=[partir.Megatron("tensor")]),
            partir.TacticError, r'Megatron: unknown mesh axis "tensor"'),
    ApiCase("megatron-fewer-than-devices", lambda: lower(mlp, {"w1": np.ones((4, 1), np.float32), "w2": np.ones((1, 4), np.float32)},
            X, tactics=[partir.Megatron("model")]), partir.TacticError,
            r"dim 1 of params\['w1'\] \(shape \(4, 1\)\) has size 1, fewer elements"),
    ApiCase("megatron-selector-nothing", lambda: lower(mlp, PARAMS, X, tactics=[partir.Megatron("model", column=("nope",), row=("nope",),
            column_bias=("nope",))]), partir.TacticError, r"Megatron column=: no argument matches 'nope'; the arguments are"),
    # ZeRO
    ApiCase("zero-stage-4", lambda: lower(mlp, PARAMS, X, tactics=[partir.ZeRO("batch", stage=4)]), partir.TacticError,
            r"ZeRO: stage must be 1, 2 or 3, got 4"),
    ApiCase("zero-stage-0", lambda: lower(mlp, PARAMS, X, tactics=[partir.ZeRO("batch", stage=0)]), partir.TacticError,
            r"stage must be 1, 2 or 3, got 0"),
    ApiCase("zero-unknown-axis", lambda: lower(mlp, PARAMS, X, tactics=[partir.ZeRO("data")]), partir.TacticError,
            r'ZeRO: unknown mesh axis "data"'),
    ApiCase("zero-nothing", lambda: lower(exp, X, tactics=[partir.ZeRO("batch", stage=1)]), partir.TacticError,
            r"ZeRO: nothing to shard"),
    ApiCase("zero-selector-fewer-than-devices", lambda: lower(mlp, {"w1": np.ones((3, 6), np.float32), "w2": np.ones((6, 4), np.float32)},
            np.ones((8, 3), np.float32), tactics=[partir.ZeRO("batch", params="params/w1")]), partir.TacticError,
            r"dim 0 of params\['w1'\] \(shape \(3, 6\)\) has size 3, fewer elements"),
    ApiCase("zero-selector-nothing", lambda: lower(mlp, PARAMS, X, tactics=[partir.ZeRO("batch", params="params/w9")]),
            partir.TacticError, r"ZeRO: no argument matches 'params/w9'"),
    ApiCase("zero-after-a-split-too-fine", lambda: lower(_momentum, {"w": np.ones((4, 8), np.float32)},
            {"w": np.zeros((4, 8), np.float32)}, X, tactics=[partir.ManualPartition({"p/w": {0: "model"}}),
            partir.ZeRO("batch", stage=3, params="p/w")]), partir.TacticError,
            r"ZeRO: p\['w'\]'s dim 0 is already split over \"model\" by the tactics before, 2 elements "
            r"per device.*leave p\['w'\] out of the selector"),
    ApiCase("zero-every-leaf-split-already", lambda: lower(_momentum, {"w": np.ones((4, 8), np.float32)},
            {"w": np.zeros((4, 8), np.float32)}, X, tactics=[partir.ManualPartition({"p/w": {0: "model"},
            "v/w": {0: "model"}}), partir.ZeRO("model", stage=1)]), partir.TacticError,
            r"ZeRO: nothing to shard: the tactics before split every leaf it would \(v/w, \.\.\.\) "
            r"over \"model\" already; give ZeRO another axis"),
    # arguments
    ApiCase("arg-str", lambda: partir.jit(lambda s: s, mesh=MESH)("hello"), partir.PartirTypeError,
            r"argument s is 'hello' \(of type str\).*make it an array"),
    ApiCase("arg-bytes", lambda: partir.jit(lambda s: s, mesh=MESH)(b"hi"), partir.PartirTypeError,
            r"argument s is b'hi' \(of type bytes\)"),
    ApiCase("arg-object", lambda: partir.jit(lambda s: s, mesh=MESH)(object()), partir.PartirTypeError,
            r"argument s is <object object .*\(of type object\)"),
    ApiCase("arg-nested-str", lambda: partir.jit(lambda d: d["x"], mesh=MESH)({"x": X, "name": "w"}),
            partir.PartirTypeError, r"argument d\['name'\] is 'w'"),
    ApiCase("arg-str-array", lambda: partir.jit(lambda s: s, mesh=MESH)(np.array(["a", "b"])),
            partir.PartirTypeError, r"argument s is an array of <U1, which no device holds"),
    ApiCase("arg-object-array", lambda: partir.jit(lambda s: s, mesh=MESH)(np.array([1, "b"], dtype=object)),
            partir.PartirTypeError, r"an array of object"),
    ApiCase("arg-lower-str", lambda: partir.jit(lambda s: s, mesh=MESH).lower("hello"), partir.PartirTypeError,
            r"argument s is 'hello'"),
    ApiCase("arg-keyword-only", lambda: partir.jit(_keyword_only, mesh=MESH)(X, y=X), partir.PartirTypeError,
            r"y can only be passed by keyword; partir needs every argument to have a position"),
    ApiCase("arg-function", lambda: partir.jit(lambda f: f, mesh=MESH)(exp), partir.PartirTypeError,
            r"argument f is <function exp.*close over it"),
    # unsupported ops: refused right after import, with the line and an alternative
    ApiCase("op-approx-top-k", lambda: refused(lambda x: jax.lax.approx_max_k(x, 2)[0]),
            partir.UnsupportedError, r"stablehlo\.custom_call @ApproxTopK at \S*" + HERE),
    ApiCase("op-ifft", lambda: refused(lambda x: jnp.fft.ifft(x).real), partir.UnsupportedError,
            _unsupported(r"stablehlo\.fft", "DFT matrix")),
    ApiCase("op-rng-uniform", lambda: refused(lambda x: x + jax.lax.rng_uniform(0.0, 1.0, x.shape)),
            partir.UnsupportedError, _unsupported(r"stablehlo\.rng", "jax.random")),
    ApiCase("op-select-and-scatter-custom-select", lambda: refused(_select_by_magnitude),
            partir.UnsupportedError, r"cannot emit stablehlo\.select_and_scatter \(op #\d+ of @main\) as JAX: "
            r"its select region is not lax\.ge, lax\.le"),
    ApiCase("op-qr", lambda: refused(lambda x: jnp.linalg.qr(x[:4, :4])[1]), partir.UnsupportedError,
            r"stablehlo\.custom_call @lapack_\w+ at \S*" + HERE),
    ApiCase("op-rfft", lambda: refused(lambda x: jnp.fft.rfft(x).real), partir.UnsupportedError,
            _unsupported(r"stablehlo\.fft", "DFT matrix")),
    ApiCase("op-fft", lambda: refused(lambda x: jnp.fft.fft(x).real), partir.UnsupportedError,
            _unsupported(r"stablehlo\.fft", "DFT matrix")),
    ApiCase("op-debug-print", lambda: refused(_debug_print), partir.UnsupportedError,
            _unsupported(r"stablehlo\.custom_call @\w+", "jax.debug.print")),
    ApiCase("op-pure-callback", lambda: refused(_while_callback), partir.UnsupportedError,
            _unsupported(r"stablehlo\.custom_call @\w+", "outside the partir.jit function")),
    ApiCase("op-eigh", lambda: refused(lambda x: jnp.linalg.eigh(x[:4] @ x[:4].T)[0]),
            partir.UnsupportedError, r"stablehlo\.custom_call @lapack_\w+ at \S*" + HERE),
    ApiCase("op-cholesky", lambda: refused(lambda x: jnp.linalg.cholesky(x[:4] @ x[:4].T + 4 * jnp.eye(4)), X),
            partir.UnsupportedError, r"stablehlo\.(cholesky|custom_call).* at \S*" + HERE),
    ApiCase("op-triangular-solve", lambda: refused(_triangular_solve), partir.UnsupportedError,
            r"stablehlo\.custom_call @lapack_\w+ at \S*" + HERE),
    ApiCase("op-svd", lambda: refused(lambda x: jnp.linalg.svd(x[:4, :4])[1]), partir.UnsupportedError,
            r"stablehlo\.custom_call @lapack_\w+ at \S*" + HERE),
]


def test_api_catalogue_is_large():
    assert len(API_CASES) >= 60


@pytest.mark.parametrize("case", API_CASES, ids=lambda c: c.id)
def test_api_bad_input(case: ApiCase):
    with pytest.raises(case.error) as info:
        case.run()
    assert isinstance(info.value, partir.PartirError)
    message = str(info.value)
    assert "\n" not in message, message
    assert re.search(case.pattern, message), message


# --------------------------------------------------------------------------
# partir-opt and partir-inspect


def _func(body: str, args: str = "%x: tensor<8x4xf32>", result: str = "tensor<8x4xf32>") -> str:
    return f"func.func @main({args}) -> {result} {{\n{body}\n}}\n"


PLAIN = _func(
    "  %y = stablehlo.exponential %x : tensor<8x4xf32>\n  func.return %y : tensor<8x4xf32>",
    args='%x: tensor<8x4xf32> {partir.name = "x"}',
)
MLP = (
    'func.func @main(%w1: tensor<4x6xf32> {partir.name = "params[\'w1\']"}, '
    '%x: tensor<8x4xf32> {partir.name = "x"}) -> tensor<8x6xf32> {\n'
    "  %y = stablehlo.dot_general %x, %w1, contracting_dims = [1] x [0] : "
    "(tensor<8x4xf32>, tensor<4x6xf32>) -> tensor<8x6xf32>\n"
    "  func.return %y : tensor<8x6xf32>\n}\n"
)
MESH_X = 'partir.mesh @mesh ["x" = 4, "y" = 2]\n'
MAP = _func(
    '  %y = "stablehlo.map"(%x) ({\n  ^bb0(%a: tensor<f32>):\n'
    "    %b = stablehlo.exponential %a : tensor<f32>\n    stablehlo.return %b : tensor<f32>\n"
    "  }) {dimensions = array<i64: 0, 1>} : (tensor<8x4xf32>) -> tensor<8x4xf32>\n"
    "  func.return %y : tensor<8x4xf32>",
    args='%x: tensor<8x4xf32> {partir.name = "x"}',
)
"""An op partir-opt reads but cannot emit (stablehlo.map)."""
DECLARE = 'partir-declare-mesh{axes="x=4","y=2"}'


@dataclass(frozen=True)
class CliCase:
    id: str
    text: str | bytes | None  # the input file's content (None: the path does not exist)
    args: tuple[str, ...]
    pattern: str


def opt(id: str, text: str | bytes | None, passes: str | None, pattern: str, *extra: str) -> CliCase:
    return CliCase(id, text, (("-p", passes) if passes else ()) + extra, pattern)


OPT_CASES = [
    # the input file
    opt("empty-file", "", None, r"error: \S+ is empty; partir-opt reads MLIR ops"),
    opt("blank-file", "  \n\n", None, r"is empty"),
    opt("missing-file", None, None, r"error: cannot read \S+: No such file or directory"),
    opt("invalid-utf8", b"\xff\xfe func", None, r"error: \S+ is not UTF-8 text \(byte 0xff at offset 0\)"),
    opt("latin1-comment", "// caf\xe9\n".encode("latin-1") + PLAIN.encode(), None, r"is not UTF-8 text \(byte 0xe9 at offset 6\)"),
    opt("deep-nesting", "builtin.module {" * 3000 + "}" * 3000, None, r"nests ops .* too deeply .*flatten"),
    opt("unclosed-module", "builtin.module {" * 3 + "}" * 2, None, r"\S+:1:\d+: error: "),
    opt("unbalanced-brace", PLAIN + "}", None, r"\S+:\d+:1: error: .*"),
    opt("missing-colon", _func("  %y = stablehlo.exponential %x tensor<8x4xf32>\n  func.return %y : tensor<8x4xf32>"),
        None, r"\S+:2:\d+: error: Expected ':'"),
    opt("unknown-op", _func("  %y = \"foo.bar\"(%x) : (tensor<8x4xf32>) -> tensor<8x4xf32>\n  func.return %y : tensor<8x4xf32>"),
        None, r"\S+:2:\d+: error: .*foo\.bar"),
    opt("unknown-type", _func("  func.return %x : tensor<8x4xq32>"), None, r"\S+:\d+:\d+: error: "),
    opt("undefined-value", _func("  func.return %z : tensor<8x4xf32>"), None, r"\S+:\d+:\d+: error: values used but not defined: \[%z\]"),
    opt("wrong-return-type", _func("  func.return %x : tensor<8x4xf32>", result="tensor<4xf32>"), None,
        r"error: Expected arguments to have the same types as the function output types; in: \"func\.return\""),
    opt("garbage", "this is not mlir", None, r"\S+:1:\d+: error: Operation this is not registered"),
    opt("range-not-int", MESH_X + _func("  func.return %x : tensor<8x4xf32>", args="%x: tensor<8x4xf32>, %r: !partir.range<x>"),
        None, r"\S+:2:\d+: error: "),
    opt("tile-negative", MESH_X + _func("  func.return %x : tensor<8x4xf32>") + '"test.op"() {a = #partir.tile<-1>} : () -> ()',
        None, r"\S+:\d+:\d+: error: "),
    opt("mesh-missing-size", 'partir.mesh @mesh ["x" = ]\n' + PLAIN, None, r"\S+:1:\d+: error: "),
    opt("mesh-unquoted-axis", "partir.mesh @mesh [x = 4]\n" + PLAIN, None, r"\S+:1:\d+: error: string literal expected"),
    opt("origin-missing-tactic", MESH_X + '"test.op"() {o = #partir.origin<1>} : () -> ()', None, r"\S+:2:\d+: error: "),
    opt("dtensor-bad-dims", MESH_X + _func("  func.return %x : !spmd.dtensor<8x4xf32, {}>", args="%x: !spmd.dtensor<8x4xf32, {}>",
        result="!spmd.dtensor<8x4xf32, {}>"), None, r"\S+:2:\d+: error: "),
    # passes and options
    opt("unknown-pass", PLAIN, "partir-megatorn", r"error: Unrecognized passes: \['partir-megatorn'\]; partir's passes: .*--help"),
    opt("unknown-option", PLAIN, f"{DECLARE},partir-zero{{axis=x stages=2}}",
        r"error: partir-zero: no option stages \(did you mean stage\?\); the options are \{axis=required stage=3 "),
    opt("misspelt-required-option", PLAIN, f"{DECLARE},partir-batch-parallel{{axs=x}}",
        r"error: partir-batch-parallel: no option axs \(did you mean axis\?\); the options are \{axis=required "),
    opt("unknown-option-hyphen", PLAIN, f"{DECLARE},partir-auto{{time-budget=2}}",
        r"error: partir-auto: no option time-budget \(did you mean time-budget-s\?\)"),
    opt("unterminated-quote", PLAIN, 'partir-declare-mesh{axes="x=4', r"error: cannot read the pass pipeline \(-p\) at column \d+: .*closing quote"),
    opt("unterminated-brace", PLAIN, "partir-declare-mesh{axes=x", r"error: cannot read the pass pipeline \(-p\)"),
    opt("stage-not-int", PLAIN, f"{DECLARE},partir-zero{{axis=x stage=x}}", r"error: partir-zero: option stage=x needs int; the options are \{axis=required stage=3 "),
    opt("tile-dim-not-int", PLAIN, f"{DECLARE},partir-tile{{value=x dim=first axis=x}}", r"error: partir-tile: option dim=first needs int"),
    opt("declare-repeated-axis", PLAIN, 'partir-declare-mesh{axes="batch=4","batch=2"}',
        r'error: partir-declare-mesh: option axes names axis "batch" twice \(=4 and =2\); give each axis once'),
    opt("declare-one-string", PLAIN, 'partir-declare-mesh{axes="batch=4,model=2"}', r'error: partir-declare-mesh: cannot read "batch=4,model=2" in option axes; write axes="batch=4","model=2"'),
    opt("declare-superscript", PLAIN, 'partir-declare-mesh{axes="batch=\u00b2"}', r"error: partir-declare-mesh: cannot read .* in option axes; write axes="),
    opt("declare-no-size", PLAIN, 'partir-declare-mesh{axes="batch"}', r'cannot read "batch" in option axes'),
    opt("declare-no-name", PLAIN, 'partir-declare-mesh{axes="=4"}', r'cannot read "=4" in option axes'),
    opt("declare-negative", PLAIN, 'partir-declare-mesh{axes="batch=-1"}', r'cannot read "batch=-1" in option axes'),
    opt("declare-zero", PLAIN, 'partir-declare-mesh{axes="batch=0"}', r"partir-declare-mesh: mesh axis 'batch' needs a positive size, got 0"),
    opt("declare-empty", PLAIN, "partir-declare-mesh", r'partir-declare-mesh requires argument "axes"'),
    opt("declare-mismatch", MESH_X + PLAIN, 'partir-declare-mesh{axes="x=2"}', r"partir-declare-mesh: the module declares mesh \{'x': 4, 'y': 2\}, but \{'x': 2\} was given"),
    opt("no-mesh", PLAIN, "partir-batch-parallel{axis=x}", r"error: BatchParallel: the module declares no mesh; .*partir-declare-mesh"),
    opt("no-mesh-tile", PLAIN, "partir-tile{value=x axis=x}", r"error: partir-tile: the module declares no mesh"),
    opt("batch-unknown-axis", PLAIN, f"{DECLARE},partir-batch-parallel{{axis=batch}}", r'error: BatchParallel: unknown mesh axis "batch"; the mesh has "x", "y"'),
    opt("unnamed-argument-selector", PLAIN.replace(' {partir.name = "x"}', ""), f"{DECLARE},partir-batch-parallel{{axis=x inputs=x}}",
        r"error: BatchParallel: no argument matches 'x'; the arguments are: args/0"),
    opt("batch-inputs-nothing", PLAIN, f"{DECLARE},partir-batch-parallel{{axis=x inputs=z}}", r"error: BatchParallel: no argument matches 'z'"),
    opt("batch-fewer-than-devices", PLAIN, 'partir-declare-mesh{axes="x=16"},partir-batch-parallel{axis=x}', r'dim 0 of x \(shape \(8, 4\)\) has size 8, fewer elements than mesh axis "x" has devices \(16\)'),
    opt("megatron-nothing", PLAIN, f"{DECLARE},partir-megatron{{axis=y}}", r"error: Megatron: no parameter is named like"),
    opt("zero-stage-5", MLP, f"{DECLARE},partir-zero{{axis=x stage=5}}", r"error: ZeRO: stage must be 1, 2 or 3, got 5"),
    opt("manual-unreadable", PLAIN, f"{DECLARE},partir-manual-partition{{spec=\"x0=x\"}}", r'error: partir-manual-partition: cannot read "x0=x"; write selector:dim=axis'),
    opt("manual-dim-word", PLAIN, f"{DECLARE},partir-manual-partition{{spec=\"x:a=x\"}}", r'cannot read "x:a=x"'),
    opt("manual-no-axis", PLAIN, f"{DECLARE},partir-manual-partition{{spec=\"x:0\"}}", r'cannot read "x:0"'),
    opt("manual-unknown-axis", PLAIN, f"{DECLARE},partir-manual-partition{{spec=\"x:0=z\"}}", r'ManualPartition: unknown mesh axis "z"'),
    opt("manual-no-match", PLAIN, f"{DECLARE},partir-manual-partition{{spec=\"w:0=x\"}}", r"ManualPartition: no argument matches 'w'"),
    opt("manual-duplicate-axis", PLAIN, f"{DECLARE},partir-manual-partition{{spec=\"x:0=x\",\"x:1=x\"}}", r'would be split over mesh axis "x" on dims 0 and 1'),
    opt("tile-index-too-big", PLAIN, f"{DECLARE},partir-tile{{value=\"5\" axis=x}}", r"error: partir-tile: the function has 1 arguments, no argument 5"),
    opt("tile-unknown-name", PLAIN, f"{DECLARE},partir-tile{{value=w axis=x}}", r"error: partir-tile: no argument matches 'w'"),
    opt("tile-unknown-axis", PLAIN, f"{DECLARE},partir-tile{{value=x axis=z}}", r'error: partir-tile: x: unknown mesh axis "z" \(the mesh has "x", "y"\)'),
    opt("tile-fewer-than-devices", PLAIN, 'partir-declare-mesh{axes="x=5"},partir-tile{value=x dim=1 axis=x}', r'error: .*has size 4, smaller than mesh axis "x" of size 5'),
    opt("tile-dim-out-of-range", PLAIN, f"{DECLARE},partir-tile{{value=x dim=5 axis=x}}", r"error: .*dim 5"),
    opt("emit-core-ir", PLAIN, f"{DECLARE},partir-emit-jax", r"error: .*!spmd\.dtensor"),
    opt("emit-unsupported-op", MAP, f"{DECLARE},partir-batch-parallel{{axis=x}},partir-lower-spmd,partir-emit-jax",
        r"error: partir cannot partition this program \(refused before partitioning\); "
        r"stablehlo\.map at op #0 of @main: instead, apply the function elementwise"),
    opt("unregistered-op", PLAIN.replace("stablehlo.exponential %x :", '"stablehlo.cholesky"(%x) {} : (tensor<8x4xf32>) ->'),
        None, r"\S+:2:\d+: error: Operation stablehlo\.cholesky is not registered"),
    opt("unknown-target", PLAIN, None, r"error: argument -t/--target: invalid choice: 'wasm'.*--help lists the options", "-t", "wasm"),
]


@dataclass(frozen=True)
class IrCase:
    id: str
    text: str
    pattern: str


def _loop(inner: str, axis: str = "x", size: int = 4, action: str = "#partir.tile<0>",
          result: str = "tensor<8x4xf32>") -> str:
    return (
        f'  %l = partir.loop "{axis}" [{action}] (%r: !partir.range<{size}>) {{\n{inner}\n'
        f"  }} : {result}\n  func.return %l : {result}"
    )


SLICE = "    %s = partir.slice 0 %x[%r] : tensor<8x4xf32> -> tensor<2x4xf32>\n    partir.yield %s : tensor<2x4xf32>"
SPMD_ARG = '%x: !spmd.dtensor<8x4xf32, [{"x"}, {}]>'
SPMD_RESULT = '!spmd.dtensor<8x4xf32, [{"x"}, {}]>'


def _spmd(body: str, args: str = SPMD_ARG, result: str = SPMD_RESULT) -> str:
    return MESH_X + _func(body, args=args, result=result)


def _local(op: str, result: str = "tensor<2x4xf32>") -> str:
    """`%x`'s device part through `op` (an spmd op on %p), returned whole again."""
    return _spmd(
        '  %p = spmd.to_local %x : !spmd.dtensor<8x4xf32, [{"x"}, {}]> -> tensor<2x4xf32>\n'
        f"  %c = {op}\n"
        f"  %o = spmd.from_local %c : {result} -> {SPMD_RESULT}\n"
        f"  func.return %o : {SPMD_RESULT}"
    )


def _all_reduce(axes: str, result: str = "tensor<8x4xf32>") -> str:
    returned = "%y" if result == "tensor<8x4xf32>" else "%x"
    return _func(f"  %y = spmd.all_reduce %x over {axes} : tensor<8x4xf32> -> {result}\n"
                 f"  func.return {returned} : tensor<8x4xf32>")


IR_CASES = [
    # partir core: mesh
    IrCase("mesh-repeated-axis", 'partir.mesh @mesh ["x" = 4, "x" = 2]\n' + PLAIN,
           r"error: mesh @mesh repeats an axis name: \['x', 'x'\]; in: .*partir\.mesh"),
    IrCase("mesh-zero-size", 'partir.mesh @mesh ["x" = 0]\n' + PLAIN, r'error: mesh axis "x" must have a positive size, got 0; in: .*partir\.mesh'),
    IrCase("mesh-names-sizes", '"partir.mesh"() <{sym_name = "mesh", axis_names = ["x", "y"], axis_sizes = array<i64: 4>}> : () -> ()\n' + PLAIN,
           r"error: mesh @mesh has 2 axis names but 1 sizes; in: .*partir\.mesh"),
    IrCase("mesh-two", MESH_X + 'partir.mesh @other ["z" = 2]\n' + PLAIN, r"error: a module declares one partir\.mesh; found @mesh, @other"),
    IrCase("mesh-in-func", _func('  partir.mesh @mesh ["x" = 4]\n  func.return %x : tensor<8x4xf32>'), r"error: .*partir\.mesh.*builtin\.module"),
    # partir core: loops
    IrCase("loop-no-mesh", _func(_loop(SLICE)), r'error: loop over "x" needs a partir\.mesh declaration.*; in: .*partir\.loop'),
    IrCase("loop-unknown-axis", MESH_X + _func(_loop(SLICE, axis="z")), r'error: unknown mesh axis "z": mesh @mesh declares "x", "y"; in: .*partir\.loop'),
    IrCase("loop-range-size", MESH_X + _func(_loop(SLICE, size=2).replace("tensor<2x4xf32>", "tensor<4x4xf32>")),
           r'error: range size 2 of loop over "x" differs from the axis size 4; in: '),
    IrCase("loop-nested-same-axis", MESH_X + _func(_loop(
        '    %i = partir.loop "x" [#partir.sum] (%q: !partir.range<4>) {\n'
        "      %s = partir.slice 0 %x[%q] : tensor<8x4xf32> -> tensor<2x4xf32>\n"
        "      partir.yield %s : tensor<2x4xf32>\n    } : tensor<2x4xf32>\n    partir.yield %i : tensor<2x4xf32>")),
        r'error: loop over "x" is nested inside another loop over the same axis'),
    IrCase("loop-yields-two", MESH_X + _func(_loop(SLICE.replace("partir.yield %s : tensor<2x4xf32>", "partir.yield %s, %s : tensor<2x4xf32>, tensor<2x4xf32>"))),
           r'error: loop over "x" must end in partir\.yield of one value'),
    IrCase("loop-element-type", MESH_X + _func(_loop(SLICE, result="tensor<8x4xf16>"), result="tensor<8x4xf16>"),
           r'error: loop over "x" yields tensor<2x4xf32> but its result is tensor<8x4xf16>'),
    IrCase("loop-tile-dim-rank", MESH_X + _func(_loop(SLICE, action="#partir.tile<2>")), r'error: loop over "x" tiles dim 2 of the rank-2 value'),
    IrCase("loop-tile-shape", MESH_X + _func(_loop(SLICE, action="#partir.tile<1>")),
           r'error: tile<1> loop over "x" of tensor<2x4xf32> gives shape 2x16, but the result is tensor<8x4xf32>'),
    IrCase("loop-sum-type", MESH_X + _func(_loop(SLICE, action="#partir.sum")),
           r'error: sum loop over "x" yields tensor<2x4xf32> but its result is tensor<8x4xf32>'),
    IrCase("loop-block-args", MESH_X + _func(
        '  %l = "partir.loop"() <{axis = "x", action = #partir.sum}> ({\n  ^b(%r: !partir.range<4>, %q: !partir.range<4>):\n'
        "    partir.yield %x : tensor<8x4xf32>\n  }) : () -> tensor<8x4xf32>\n  func.return %l : tensor<8x4xf32>"),
        r'error: loop over "x" must have exactly one !partir\.range block argument'),
    IrCase("range-zero", MESH_X + _func("  func.return %x : tensor<8x4xf32>", args="%x: tensor<8x4xf32>, %r: !partir.range<0>"),
           r"error: range size must be positive, got 0"),
    IrCase("yield-outside-loop", MESH_X + _func("  partir.yield %x : tensor<8x4xf32>"), r"error: .*partir\.yield.*partir\.loop"),
    # partir core: slices
    IrCase("slice-index-not-enclosing", MESH_X + _func(
        "  %s = partir.slice 0 %x[%r] : tensor<8x4xf32> -> tensor<2x4xf32>\n  func.return %x : tensor<8x4xf32>",
        args="%x: tensor<8x4xf32>, %r: !partir.range<4>"),
        r"error: slice index must be the range of an enclosing partir\.loop; in: .*partir\.slice"),
    IrCase("slice-uneven-text", MESH_X + _func(_loop(SLICE.replace("tensor<2x4xf32>", "tensor<3x4xf32>"))),
           r"\S+:\d+:\d+: error: slice 0 from tensor<8x4xf32> to tensor<3x4xf32> is not an even split of dim 0"),
    IrCase("slice-dim-out-of-range", MESH_X + _func(_loop(
        '    %s = "partir.slice"(%x, %r) <{dim = 2 : i64}> : (tensor<8x4xf32>, !partir.range<4>) -> tensor<2x4xf32>\n'
        "    partir.yield %s : tensor<2x4xf32>")), r"error: slice dim 2 is out of range for tensor<8x4xf32>"),
    IrCase("slice-indivisible", 'partir.mesh @mesh ["x" = 3]\n' + _func(_loop(
        '    %s = "partir.slice"(%x, %r) <{dim = 0 : i64}> : (tensor<8x4xf32>, !partir.range<3>) -> tensor<2x4xf32>\n'
        "    partir.yield %s : tensor<2x4xf32>", size=3, action="#partir.sum", result="tensor<2x4xf32>"), result="tensor<2x4xf32>"),
        r'error: dim 0 of tensor<8x4xf32> is not divisible by the size 3 of axis "x"'),
    IrCase("slice-result-shape", MESH_X + _func(_loop(
        '    %s = "partir.slice"(%x, %r) <{dim = 0 : i64}> : (tensor<8x4xf32>, !partir.range<4>) -> tensor<2x2xf32>\n'
        "    partir.yield %s : tensor<2x2xf32>", action="#partir.sum", result="tensor<2x2xf32>"), result="tensor<2x2xf32>"),
        r"error: slice 0 of tensor<8x4xf32> over 4 parts gives tensor<2x4xf32>, but the result is tensor<2x2xf32>"),
    # spmd: distributed types
    IrCase("dtensor-rank", _spmd("  func.return %x : !spmd.dtensor<8x4xf32, [{}]>", args="%x: !spmd.dtensor<8x4xf32, [{}]>",
           result="!spmd.dtensor<8x4xf32, [{}]>"), r"error: tensor<8x4xf32> has 2 dims, but the distribution names 1"),
    IrCase("dtensor-axis-twice", _spmd('  func.return %x : !spmd.dtensor<8x4xf32, [{"x"}, {"x"}]>',
           args='%x: !spmd.dtensor<8x4xf32, [{"x"}, {"x"}]>', result='!spmd.dtensor<8x4xf32, [{"x"}, {"x"}]>'),
           r"error: a mesh axis is used twice in distribution \['x', 'x'\]"),
    IrCase("dtensor-split-and-partial", _spmd('  func.return %x : !spmd.dtensor<8x4xf32, [{"x"}, {}], partial {"x"}>',
           args='%x: !spmd.dtensor<8x4xf32, [{"x"}, {}], partial {"x"}>', result='!spmd.dtensor<8x4xf32, [{"x"}, {}], partial {"x"}>'),
           r"error: a mesh axis is used twice in distribution"),
    IrCase("to-local-unknown-axis", _spmd(
        '  %p = spmd.to_local %x : !spmd.dtensor<8x4xf32, [{"z"}, {}]> -> tensor<2x4xf32>\n  func.return %x : !spmd.dtensor<8x4xf32, [{"z"}, {}]>',
        args='%x: !spmd.dtensor<8x4xf32, [{"z"}, {}]>', result='!spmd.dtensor<8x4xf32, [{"z"}, {}]>'),
        r'error: unknown mesh axis "z" in !spmd\.dtensor.*; in: .*spmd\.to_local'),
    IrCase("to-local-indivisible", _spmd(
        '  %p = spmd.to_local %x : !spmd.dtensor<6x4xf32, [{"x"}, {}]> -> tensor<2x4xf32>\n  func.return %x : !spmd.dtensor<6x4xf32, [{"x"}, {}]>',
        args='%x: !spmd.dtensor<6x4xf32, [{"x"}, {}]>', result='!spmd.dtensor<6x4xf32, [{"x"}, {}]>'),
        r'error: dim 0 of tensor<6x4xf32> is not divisible over "x" of size 4'),
    IrCase("to-local-wrong-part", _spmd(
        '  %p = spmd.to_local %x : !spmd.dtensor<8x4xf32, [{"x"}, {}]> -> tensor<4x4xf32>\n  func.return %x : ' + SPMD_RESULT),
        r"error: spmd\.to_local: the device part of !spmd\.dtensor<8x4xf32, \[\{\"x\"\}, \{\}\]> is tensor<2x4xf32>, not tensor<4x4xf32>"),
    IrCase("to-local-not-dtensor", _spmd(
        "  %p = spmd.to_local %y : tensor<8x4xf32> -> tensor<2x4xf32>\n  func.return %x : " + SPMD_RESULT,
        args=SPMD_ARG + ", %y: tensor<8x4xf32>"), r"error: spmd\.to_local converts between !spmd\.dtensor and tensor"),
    IrCase("from-local-wrong-part", _local("stablehlo.exponential %p : tensor<2x4xf32>").replace(
        f"%o = spmd.from_local %c : tensor<2x4xf32> -> {SPMD_RESULT}", '%o = spmd.from_local %c : tensor<2x4xf32> -> !spmd.dtensor<8x4xf32, [{}, {}]>').replace(
        f"func.return %o : {SPMD_RESULT}", "func.return %x : " + SPMD_RESULT), r"error: spmd\.from_local: the device part of .* is tensor<8x4xf32>, not tensor<2x4xf32>"),
    # spmd: collectives
    IrCase("collective-no-mesh", _all_reduce('["x"]'),
           r"error: spmd\.all_reduce needs a partir\.mesh declaration in its module"),
    IrCase("collective-unknown-axis", MESH_X + _all_reduce('["z"]'),
           r'error: spmd\.all_reduce: unknown mesh axis "z" \(the mesh has "x", "y"\)'),
    IrCase("collective-repeated-axis", MESH_X + _all_reduce('["x", "x"]'),
           r"error: spmd\.all_reduce: needs distinct mesh axes, got \['x', 'x'\]"),
    IrCase("collective-no-axes", MESH_X + _all_reduce('[]'),
           r"error: spmd\.all_reduce: needs distinct mesh axes, got \[\]"),
    IrCase("all-reduce-element-type", MESH_X + _all_reduce('["x"]', 'tensor<8x4xf16>'),
           r"error: spmd\.all_reduce: element types differ"),
    IrCase("all-reduce-shape", MESH_X + _all_reduce('["x"]', 'tensor<4x4xf32>'),
           r"error: spmd\.all_reduce over \['x'\]: tensor<8x4xf32> gives tensor<8x4xf32>, but the result is tensor<4x4xf32>"),
    IrCase("all-gather-shape", _local('spmd.all_gather %p dim 0 over ["x"] : tensor<2x4xf32> -> tensor<2x4xf32>'),
           r"error: spmd\.all_gather over \['x'\]: tensor<2x4xf32> gives tensor<8x4xf32>, but the result is tensor<2x4xf32>"),
    IrCase("all-gather-dim", _local('spmd.all_gather %p dim 3 over ["x"] : tensor<2x4xf32> -> tensor<2x4xf32>'),
           r"error: spmd\.all_gather: dim 3 is out of range for tensor<2x4xf32>"),
    IrCase("reduce-scatter-indivisible", _local('spmd.reduce_scatter %p dim 0 over ["x"] : tensor<2x4xf32> -> tensor<2x4xf32>'),
           r"error: spmd\.reduce_scatter: dim 0 of tensor<2x4xf32> is not divisible by the 4 devices of \['x'\]"),
    IrCase("reduce-scatter-shape", _local('spmd.reduce_scatter %p dim 1 over ["x"] : tensor<2x4xf32> -> tensor<2x4xf32>'),
           r"error: spmd\.reduce_scatter over \['x'\]: tensor<2x4xf32> gives tensor<2x1xf32>"),
    IrCase("local-slice-shape", _local('spmd.local_slice %p dim 1 over ["y"] : tensor<2x4xf32> -> tensor<2x4xf32>'),
           r"error: spmd\.local_slice over \['y'\]: tensor<2x4xf32> gives tensor<2x2xf32>"),
    IrCase("all-to-all-same-dims", _local('spmd.all_to_all %p split 1 concat 1 over ["y"] : tensor<2x4xf32> -> tensor<2x4xf32>'),
           r"error: spmd\.all_to_all: split and concat dims are both 1"),
    IrCase("all-to-all-shape", _local('spmd.all_to_all %p split 1 concat 0 over ["y"] : tensor<2x4xf32> -> tensor<2x4xf32>'),
           r"error: spmd\.all_to_all over \['y'\]: tensor<2x4xf32> gives tensor<4x2xf32>"),
]


INSPECT_CASES = [
    CliCase("invalid-utf8", b"\xff\xfe", (), r"error: \S+ is not UTF-8 text \(byte 0xff at offset 0\)"),
    CliCase("missing-file", None, (), r"error: cannot read \S+: No such file or directory"),
    CliCase("empty-file", "", (), r"error: \S+ is empty; give a stage's MLIR text"),
    CliCase("parse-error", PLAIN.replace(": tensor<8x4xf32>\n  func", " tensor<8x4xf32>\n  func"), (), r"error: \S+:2:\d+: Expected ':'"),
    CliCase("deep-nesting", "builtin.module {" * 3000 + "}" * 3000, (), r"error: \S+ nests ops .* too deeply"),
    CliCase("shape-changing-all-gather", _local('spmd.all_gather %p dim 0 over ["x"] : tensor<2x4xf32> -> tensor<2x4xf32>'), (),
            r"error: \S+ does not verify: spmd\.all_gather over \['x'\]: tensor<2x4xf32> gives tensor<8x4xf32>, but the result is tensor<2x4xf32>; in: "),
    CliCase("loop-unknown-axis", MESH_X + _func(_loop(SLICE, axis="z")), (),
            r'error: \S+ does not verify: unknown mesh axis "z": mesh @mesh declares "x", "y"'),
    CliCase("dtensor-axis-twice", _spmd('  func.return %x : !spmd.dtensor<8x4xf32, [{"x"}, {"x"}]>',
            args='%x: !spmd.dtensor<8x4xf32, [{"x"}, {"x"}]>', result='!spmd.dtensor<8x4xf32, [{"x"}, {"x"}]>'), (),
            r"error: \S+ does not verify: a mesh axis is used twice"),
    CliCase("three-files", PLAIN, ("EXTRA", "EXTRA"), r"error: give one file to report on, or two to diff"),
    CliCase("diff-with-bad-file", PLAIN, ("MISSING",), r"error: cannot read \S+"),
    CliCase("mesh-repeated-axis", 'partir.mesh @mesh ["x" = 4, "x" = 2]\n' + PLAIN, (), r"error: \S+ does not verify: mesh @mesh repeats an axis name"),
    CliCase("collective-unknown-axis", MESH_X + _all_reduce('["z"]'), (),
            r'error: \S+ does not verify: spmd\.all_reduce: unknown mesh axis "z"'),
]


def _run_cli(main: Callable[[list[str]], int], case: CliCase, tmp_path: Path, capsys) -> str:
    path = tmp_path / "input.mlir"
    if isinstance(case.text, bytes):
        path.write_bytes(case.text)
    elif case.text is not None:
        path.write_text(case.text, encoding="utf-8")
    args = []
    for arg in case.args:
        if arg == "EXTRA":
            arg = str(path)
        elif arg == "MISSING":
            arg = str(tmp_path / "missing.mlir")
        args.append(arg)
    try:
        code = main([str(path), *args])
    except SystemExit as exit:  # argparse's usage errors exit from inside main
        code = exit.code
    out = capsys.readouterr()
    assert code == 1, (code, out.err)
    assert "Traceback" not in out.err
    lines = out.err.splitlines()
    assert len(lines) == 1, out.err
    return lines[0]


CLI_CASES = [
    *(("partir-opt", opt_cli.main, case) for case in OPT_CASES),
    *(("ir", opt_cli.main, CliCase(case.id, case.text, (), case.pattern)) for case in IR_CASES),
    *(("partir-inspect", inspect_cli.main, case) for case in INSPECT_CASES),
]


@pytest.mark.parametrize(("area", "main", "case"), CLI_CASES, ids=[f"{a}-{c.id}" for a, _, c in CLI_CASES])
def test_cli_bad_input(area: str, main: Callable[[list[str]], int], case: CliCase, tmp_path, capsys):
    line = _run_cli(main, case, tmp_path, capsys)
    assert re.search(case.pattern, line), line


def test_catalogue_size():
    sizes = {"api": len(API_CASES), "partir-opt": len(OPT_CASES), "ir": len(IR_CASES),
             "partir-inspect": len(INSPECT_CASES)}
    assert sum(sizes.values()) >= 150, sizes
    for table in (API_CASES, OPT_CASES, IR_CASES, INSPECT_CASES):
        ids = [c.id for c in table]
        assert len(ids) == len(set(ids))


@pytest.mark.parametrize("module", ["partir.opt", "partir.inspect"])
def test_cli_exit_status_in_a_process(module, tmp_path):
    """The in-process runs above, as a real process: status exactly 1, one line."""
    bad = tmp_path / "bad.mlir"
    bad.write_bytes(b"\xff")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    done = subprocess.run([sys.executable, "-m", module, str(bad)], capture_output=True, text=True, env=env)
    assert done.returncode == 1
    assert done.stderr.splitlines() == [f"error: {bad} is not UTF-8 text (byte 0xff at offset 0); MLIR files are UTF-8"]
