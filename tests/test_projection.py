"""The factor projection: onto an op's factors and back, and loop relations."""

from __future__ import annotations

from dialects.context import make_context
from dialects.distribution import Distribution
from dialects.functions import entry_function
from dialects.parser import PartirParser
from rewrites.projection import (
    LoopRelations,
    Partial,
    Replicated,
    Split,
    follow,
    operand_distribution,
    project,
    result_distribution,
)
from rewrites.registry import RuleMemo, rule_for

MATMUL = """\
builtin.module {
  partir.mesh @mesh ["a" = 2, "b" = 4]
  func.func @main(%x: tensor<8x16xf32>, %w: tensor<16x4xf32>) -> tensor<8x4xf32> {
    %y = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<8x16xf32>, tensor<16x4xf32>) -> tensor<8x4xf32>
    func.return %y : tensor<8x4xf32>
  }
}
"""


def parse(text: str):
    return PartirParser(make_context(), text, "t.mlir").parse_module()


def the_op(module, name: str):
    return next(op for op in module.walk() if op.name == name)


def test_projection_onto_a_matmuls_factors_and_back():
    dot = the_op(parse(MATMUL), "stablehlo.dot_general")
    rule = rule_for(dot)
    assert rule is not None
    x = Distribution((("b",), ("a",)))  # rows over "b", the contracted dim over "a"
    projection = project(rule, [x, None])
    assert not projection.conflicts
    result, lost = result_distribution(rule, projection)
    assert result == Distribution((("b",), ()), partial=("a",)) and not lost
    assert operand_distribution(rule, projection, 1) == Distribution((("a",), ()))


def test_projection_drops_an_axis_two_operands_split_along_different_factors():
    dot = the_op(parse(MATMUL), "stablehlo.dot_general")
    rule = rule_for(dot)
    assert rule is not None
    projection = project(rule, [Distribution((("a",), ())), Distribution((("a",), ()))])
    assert projection.conflicts == {"a"}
    result, lost = result_distribution(rule, projection)
    assert result == Distribution(((), ())) and lost == {"a"}


def test_follow_gives_the_factor_or_the_reason():
    dot = the_op(parse(MATMUL), "stablehlo.dot_general")
    rule = rule_for(dot)
    assert rule is not None
    assert follow(rule, 0, 1, 2) == rule.operand_factor(0, 1)
    assert "do not divide" in str(follow(rule, 1, 1, 8))


SOFTMAX_PART = """\
builtin.module {
  partir.mesh @mesh ["a" = 2, "b" = 4]
  func.func @main(%x: tensor<4x8xf32>) -> tensor<4x8xf32> {
    %c = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %y = partir.loop "b" [#partir.tile<0>] (%rb: !partir.range<4>) {
      %z = partir.loop "a" [#partir.tile<1>] (%ra: !partir.range<2>) {
        %xa = partir.slice 1 %x[%ra] : tensor<4x8xf32> -> tensor<4x4xf32>
        %s = stablehlo.reduce(%xa init: %c) across dimensions = [0] : (tensor<4x4xf32>, tensor<f32>) -> tensor<4xf32>
        reducer(%p: tensor<f32>, %q: tensor<f32>) {
          %pq = stablehlo.add %p, %q : tensor<f32>
          stablehlo.return %pq : tensor<f32>
        }
        %sb = stablehlo.broadcast_in_dim %s, dims = [1] : (tensor<4xf32>) -> tensor<4x4xf32>
        %d = stablehlo.subtract %xa, %sb : tensor<4x4xf32>
        %part = partir.slice 0 %d[%rb] : tensor<4x4xf32> -> tensor<1x4xf32>
        partir.yield %part : tensor<1x4xf32>
      } : tensor<1x8xf32>
      partir.yield %z : tensor<1x8xf32>
    } : tensor<4x8xf32>
    func.return %y : tensor<4x8xf32>
  }
}
"""


def test_loop_relations_of_values_around_a_slice_by_an_outer_loop():
    module = parse(SOFTMAX_PART)
    module.verify()
    relations = LoopRelations.of(entry_function(module).body.block)
    values = {v.name_hint: v for op in module.walk() for v in op.results if v.name_hint}
    # %d depends on "a" (the part of %x) but not on "b": %part slices it by "b",
    # so it is whole over "b" (what the lowering's local slice relies on).
    d = relations(values["d"])
    assert d.on("a") == Split(1) and d.on("b") == Replicated() and d.known
    assert relations(values["part"]).dist == Distribution((("b",), ("a",)))
    s = relations(values["s"])
    assert s.on("a") == Split(0) and s.on("b") == Replicated()
    assert relations(values["z"]).dist == Distribution((("b",), ()))
    assert relations(values["y"]).dist == Distribution(((), ()))


def test_a_summand_inside_a_sum_loop_is_partial():
    text = MATMUL.replace(
        "    %y = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : "
        "(tensor<8x16xf32>, tensor<16x4xf32>) -> tensor<8x4xf32>\n",
        """    %y = partir.loop "a" [#partir.sum] (%r: !partir.range<2>) {
      %xs = partir.slice 1 %x[%r] : tensor<8x16xf32> -> tensor<8x8xf32>
      %ws = partir.slice 0 %w[%r] : tensor<16x4xf32> -> tensor<8x4xf32>
      %m = stablehlo.dot_general %xs, %ws, contracting_dims = [1] x [0] : (tensor<8x8xf32>, tensor<8x4xf32>) -> tensor<8x4xf32>
      %n = stablehlo.negate %m : tensor<8x4xf32>
      partir.yield %n : tensor<8x4xf32>
    } : tensor<8x4xf32>
""",
    )
    module = parse(text)
    module.verify()
    relations = LoopRelations.of(entry_function(module).body.block)
    values = {v.name_hint: v for op in module.walk() for v in op.results if v.name_hint}
    assert relations(values["m"]).on("a") == Partial()
    # negate of a summand: unknown going forward, a summand as the yield says.
    assert relations(values["n"]).on("a") == Partial()


RESHAPE_UNDER_TWO_LOOPS = """\
builtin.module {
  partir.mesh @mesh ["a" = 2, "b" = 4]
  func.func @main(%x: tensor<1x2048xf32>) -> tensor<4x4x128xf32> {
    %y = partir.loop "b" [#partir.tile<0>] (%rb: !partir.range<4>) {
      %xb = partir.slice 1 %x[%rb] : tensor<1x2048xf32> -> tensor<1x512xf32>
      %z = partir.loop "a" [#partir.tile<1>] (%ra: !partir.range<2>) {
        %xa = partir.slice 1 %xb[%ra] : tensor<1x512xf32> -> tensor<1x256xf32>
        %r = stablehlo.reshape %xa : (tensor<1x256xf32>) -> tensor<1x2x128xf32>
        %n = stablehlo.negate %r : tensor<1x2x128xf32>
        partir.yield %n : tensor<1x2x128xf32>
      } : tensor<1x4x128xf32>
      partir.yield %z : tensor<1x4x128xf32>
    } : tensor<4x4x128xf32>
    func.return %y : tensor<4x4x128xf32>
  }
}
"""


def test_a_reshape_does_not_guess_which_size_1_dim_an_outer_split_took():
    # Locally (1x256 -> 1x2x128) the split of dim 1 would land on dim 1, but
    # globally (1x2048 -> 4x4x128) "b" took dim 0, whose part is size 1: the
    # reshape's factor is unplaced, and the loops that yield the value decide.
    module = parse(RESHAPE_UNDER_TWO_LOOPS)
    module.verify()
    reshape = the_op(module, "stablehlo.reshape")
    assert rule_for(reshape).unplaced
    relations = LoopRelations.of(entry_function(module).body.block)
    values = {v.name_hint: v for op in module.walk() for v in op.results if v.name_hint}
    assert relations(values["n"]).dist == Distribution((("b",), ("a",), ()))
    assert relations(values["r"]).dist == Distribution((("b",), ("a",), ()))


def reshape_rule_of(src: str, out: str):
    text = f"""builtin.module {{
  func.func @main(%x: tensor<{src}xf32>) -> tensor<{out}xf32> {{
    %r = stablehlo.reshape %x : (tensor<{src}xf32>) -> tensor<{out}xf32>
    func.return %r : tensor<{out}xf32>
  }}
}}"""
    return rule_for(the_op(parse(text), "stablehlo.reshape"))


def test_only_factors_next_to_skipped_size_1_dims_are_unplaced():
    assert not reshape_rule_of("256", "2x128").unplaced
    assert not reshape_rule_of("8x32", "256").unplaced
    assert not reshape_rule_of("16", "2x1x8").unplaced  # the size-1 dim is minor to a split
    assert reshape_rule_of("256", "1x256").unplaced == {0}
    assert reshape_rule_of("1x256", "2x128").unplaced == {0}
    assert reshape_rule_of("4x1x64", "4x2x32").unplaced == {1}


def test_the_rule_memo_gives_rule_for_s_rule_and_looks_each_signature_up_once(monkeypatch):
    """`RuleMemo` (what `LoopRelations` asks) answers each op of a training
    step as `rule_for` does, and looks a region-free op's rule up once per
    signature (the program's types and properties are shared objects)."""
    from examples import block_train_step
    from partir import import_jax
    from rewrites import registry

    module = import_jax(block_train_step.program, *block_train_step.make_args())
    ops = [op for op in module.walk() if op.name.startswith("stablehlo.")]
    want = [rule_for(op) for op in ops]
    looked_up = []

    def counted(op):
        looked_up.append(op)
        return rule_for(op)

    monkeypatch.setattr(registry, "rule_for", counted)
    memo = RuleMemo()
    assert [memo(op) for op in ops] == want
    region_free = [op for op in ops if not op.regions and op.name != "stablehlo.constant"]
    signatures = {registry._signature(op) for op in region_free}
    free = set(region_free)
    assert len([op for op in looked_up if op in free]) == len(signatures) < len(region_free)
