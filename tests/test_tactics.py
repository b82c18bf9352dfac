"""Tactics: name selection, and clear errors before any rewrite."""

from __future__ import annotations

import numpy as np
import pytest

import partir
from examples import block_train_step, mlp_train_step, stack_train_step
from partir.importer import entry_function
from partir.selectors import matches, select, slash_path
from partir.tactics import ProgramView, zero_dim


def _module(example=mlp_train_step, **sizes):
    return partir.import_jax(example.program, *example.make_args(**sizes))


@pytest.mark.parametrize(("pattern", "path", "expected"), [
    ("params/**/wq", "params['blocks'][3]['attn']['wq']", True),
    ("params/*/w1", "params['mlp']['w1']", True),
    ("params/*/w1", "params['a']['b']['w1']", False),
    ("params/**", "params['a']", True),
    ("params/**", "x", False),
    ("**/bias", "params['ln']['bias']", True),
    ("params['w1']", "params['w1']", True),
    ("params['w1']", "params['w2']", False),
    ("params/w[12]", "params['w2']", True),
    ("params/w[!12]", "params['w2']", False),
    ("result/1/*", "result[1]['w1']", True),
    ("x", "x", True),
    ("x", "xs", False),
    ("state/0/attn/query/kernel", "state[0]['attn']['query']['kernel'].value", True),
    ("**/value", "state[0]['attn']['query']['kernel'].value", False),
    ("params/**/value", "params['attn']['value']", True),
])
def test_selector_syntax(pattern: str, path: str, expected: bool):
    assert matches(pattern, path) is expected


def test_slash_paths():
    assert slash_path("params['blocks'][3]['attn']['wq']") == "params/blocks/3/attn/wq"
    assert slash_path("result[0]") == "result/0"
    assert select(["**/w1", "x"], ["params['w1']", "x", "y"]) == [0, 1]


def test_megatron_picks_the_documented_names():
    module = _module(block_train_step)
    view = ProgramView.of(entry_function(module))
    planned = partir.Megatron("model").plan(view, partir.Mesh({"model": 2}))
    picked = {slash_path(p.leaf.name): p.dim for p in planned}
    assert picked == {
        "params/attn/wq": 1, "params/attn/wk": 1, "params/attn/wv": 1,
        "params/attn/bq": 0, "params/attn/bk": 0, "params/attn/bv": 0,
        "params/attn/wo": 0, "params/mlp/w_in": 1, "params/mlp/b_in": 0,
        "params/mlp/w_out": 0,
    }


def test_megatron_takes_your_own_names():
    module = _module()
    view = ProgramView.of(entry_function(module))
    planned = partir.Megatron("model", column=["params/w2"], column_bias=[], row=["params/w1"]).plan(
        view, partir.Mesh({"model": 2}))
    assert {slash_path(p.leaf.name): p.dim for p in planned} == {"params/w2": 1, "params/w1": 0}


def test_megatron_splits_out_in_weights_on_their_other_dim():
    """A leaf named `weight` is stored `[out, in]` (PyTorch's and equinox's
    `Linear`): a column weight is split on dim -2, a row weight on -1; a
    `kernel` (flax, `[in, out]`) and the biases as usual."""
    params = {
        "attn": {"query_proj": {"weight": np.ones((8, 16), np.float32)},
                 "output_proj": {"weight": np.ones((16, 8), np.float32)}},
        "fc1": {"kernel": np.ones((16, 32), np.float32), "bias": np.ones(32, np.float32)},
        "fc2": {"weight": np.ones((16, 32), np.float32)},
    }

    def forward(params, x):
        h = x @ params["attn"]["query_proj"]["weight"].T @ params["attn"]["output_proj"]["weight"].T
        h = h @ params["fc1"]["kernel"] + params["fc1"]["bias"]
        return h @ params["fc2"]["weight"].T

    module = partir.import_jax(forward, params, np.ones((4, 16), np.float32))
    view = ProgramView.of(entry_function(module))
    planned = partir.Megatron("model").plan(view, partir.Mesh({"model": 2}))
    assert {slash_path(p.leaf.name): p.dim for p in planned} == {
        "params/attn/query_proj/weight": 0, "params/attn/output_proj/weight": 1,
        "params/fc1/kernel": 1, "params/fc1/bias": 0, "params/fc2/weight": 1,
    }


@pytest.mark.parametrize(("shape", "dim"), [
    ((6, 4), 0),       # dim 0 has an element per device: split there (padded to 8)
    ((2, 16, 8), 1),   # 2 layers over 4 devices: the next dim the axis divides
    ((2, 6, 5), 1),    # none divides: the first with an element per device (padded)
    ((2, 2, 8), 2),
    ((3,), None),      # too short: stays replicated
    ((), None),
])
def test_zero_splits_the_first_dim_long_enough(shape, dim):
    assert zero_dim(shape, 4) == dim


def test_batch_parallel_default_inputs_are_the_data():
    view = ProgramView.of(entry_function(_module(block_train_step)))
    planned = partir.BatchParallel("batch").plan(view, partir.Mesh({"batch": 4}))
    assert [p.leaf.name for p in planned] == ["x", "y"]


def test_zero_stages_select_more_and_more():
    view = ProgramView.of(entry_function(_module(stack_train_step, layers_=1)))
    mesh = partir.Mesh({"data": 2})
    counts = [len(partir.ZeRO("data", stage).plan(view, mesh)) for stage in (1, 2, 3)]
    assert counts[0] < counts[1] < counts[2]
    zero = partir.ZeRO("data", 1)
    plan = zero.plan(view, mesh)
    passed = {p.leaf.name: p.reason for p in plan.passed}  # a scalar stays replicated
    assert passed["opt_state['count']"].endswith("a scalar, left whole")
    assert zero.plan(view, mesh) == plan  # plan is pure: same tactic, same plan


def _expect_error_before_rewrites(tactics, match: str, mesh=None):
    module = _module()
    before = str(module)
    with pytest.raises(ValueError, match=match):
        partir.partition(module, mesh or partir.Mesh({"batch": 4, "model": 2}), tactics)
    assert str(module) == before  # nothing was rewritten, not even the mesh declared


def test_unknown_axis_is_reported_before_any_rewrite():
    _expect_error_before_rewrites(
        [partir.BatchParallel("batch"), partir.Megatron("tensor")],
        r'Megatron: unknown mesh axis "tensor"; the mesh has "batch", "model"')


def test_a_name_that_selects_nothing_lists_the_names():
    _expect_error_before_rewrites(
        [partir.ManualPartition({"params/w3": {0: "batch"}})],
        r"ManualPartition: no argument matches 'params/w3'; the arguments are: "
        r"params/b1, params/b2, params/w1, params/w2, x, y")


def test_a_dimension_smaller_than_the_axis_is_reported_with_the_value():
    module = _module(batch=4)
    before = str(module)
    with pytest.raises(partir.TacticError, match=r'dim 0 of x \(shape \(4, 32\)\) has size 4, '
                       r'fewer elements than mesh axis "batch" has devices \(8\)'):
        partir.partition(module, partir.Mesh({"batch": 8}), [partir.BatchParallel("batch")])
    assert str(module) == before


def test_megatron_without_matching_names_says_how_to_fix_it():
    module = partir.import_jax(lambda a, b: a @ b, np.ones((4, 4)), np.ones((4, 4)))
    with pytest.raises(partir.TacticError, match="pass column=, row= selectors"):
        partir.partition(module, partir.Mesh({"model": 2}), [partir.Megatron("model")])


def test_mesh_rejects_bad_axes():
    with pytest.raises(ValueError, match="mesh axis 'a' needs a positive size, got 0"):
        partir.Mesh({"a": 0})
    with pytest.raises(TypeError, match="non-empty"):
        partir.Mesh({})


def test_a_dim_split_by_two_tactics_is_split_over_both_and_summed_once():
    """Batch rows over "batch", then the same rows over "model" too: the
    second split is minor within the first (rows over ("batch", "model")),
    so the input arrives split over both and the sum over the rows is one
    all-reduce over both axes, not a gather over one and a sum over the other."""
    import jax
    import jax.numpy as jnp

    def f(x, w):
        return jnp.sum(jnp.tanh(x @ w), axis=0)

    rng = np.random.default_rng(0)
    x = rng.standard_normal((16, 8)).astype(np.float32)
    w = rng.standard_normal((8, 4)).astype(np.float32)
    mesh = partir.Mesh({"batch": 4, "model": 2})
    tactics = [partir.BatchParallel("batch", inputs="x"),
               partir.ManualPartition({"x": {0: "model"}})]
    compiled = partir.jit(f, mesh=mesh, tactics=tactics)
    np.testing.assert_allclose(compiled(x, w), jax.jit(f)(x, w), rtol=1e-5, atol=1e-5)
    lowered = compiled.lower(x, w)
    assert [(c.kind, c.axes) for c in lowered.collectives] == [("all_reduce", ("batch", "model"))]
    spec = lowered.compile().program.IN_SPECS[0]
    assert spec == jax.sharding.PartitionSpec(("batch", "model"), None)


def _linen_vit() -> tuple[object, object]:
    """A small ViT in flax linen as its authors write it (patch `Conv`, a
    class token, `Encoder1DBlock`s of `MultiHeadDotProductAttention` and an
    `MlpBlock` of two `Dense` named by position, a `Dense` head), and its
    parameters."""
    import flax.linen as nn
    import jax
    import jax.numpy as jnp

    class MlpBlock(nn.Module):
        @nn.compact
        def __call__(self, x):
            x = nn.gelu(nn.Dense(32)(x))
            return nn.Dense(16)(x)

    class Encoder1DBlock(nn.Module):
        @nn.compact
        def __call__(self, x):
            h = nn.LayerNorm()(x)
            x = x + nn.MultiHeadDotProductAttention(num_heads=4)(h, h)
            return x + MlpBlock()(nn.LayerNorm()(x))

    class ViT(nn.Module):
        @nn.compact
        def __call__(self, images):
            x = nn.Conv(16, (4, 4), strides=(4, 4), name="embedding")(images)
            x = x.reshape(x.shape[0], -1, 16)
            cls = self.param("cls", nn.initializers.zeros, (1, 1, 16))
            x = jnp.concatenate([jnp.tile(cls, (x.shape[0], 1, 1)), x], axis=1)
            for i in range(2):
                x = Encoder1DBlock(name=f"encoderblock_{i}")(x)
            return nn.Dense(10, name="head")(nn.LayerNorm(name="encoder_norm")(x[:, 0]))

    model = ViT()
    images = np.ones((2, 8, 8, 3), np.float32)
    params = jax.jit(model.init)(jax.random.key(0), images)
    return model, params


def test_default_megatron_on_a_flax_linen_vit_is_the_whole_heads_split():
    """Default `Megatron` on a flax linen ViT (no name it knows but
    query/key/value): q/k/v `[in, heads, head_dim]` on heads, `out`
    `[heads, head_dim, out]` on heads, the `MlpBlock`'s `Dense_0` column
    (and its bias) and `Dense_1` row; the patch embedding, the head and the
    norms whole. The plan says why, and names nothing else."""
    pytest.importorskip("flax.linen")
    model, params = _linen_vit()

    def forward(params, images):
        return model.apply(params, images)

    module = partir.import_jax(forward, params, np.ones((8, 8, 8, 3), np.float32))
    view = ProgramView.of(entry_function(module))
    plan = partir.Megatron("model").plan(view, partir.Mesh({"model": 2}))
    picked = {slash_path(t.leaf.name).split("/", 2)[-1]: (t.dim, t.role) for t in plan}
    for block in ("encoderblock_0", "encoderblock_1"):
        attention, mlp = f"{block}/MultiHeadDotProductAttention_0", f"{block}/MlpBlock_0"
        for name in ("query", "key", "value"):
            assert picked.pop(f"{attention}/{name}/kernel") == (1, "column weight")
            assert picked.pop(f"{attention}/{name}/bias") == (0, "column bias")
        assert picked.pop(f"{attention}/out/kernel") == (0, "row weight")
        assert picked.pop(f"{mlp}/Dense_0/kernel") == (1, "column weight")
        assert picked.pop(f"{mlp}/Dense_0/bias") == (0, "column bias")
        assert picked.pop(f"{mlp}/Dense_1/kernel") == (0, "row weight")
    assert picked == {}
    reasons = {slash_path(t.leaf.name).split("/")[-2]: t.reason for t in plan}
    assert reasons["out"].endswith("[heads, head_dim, out], the output projection of attention "
                                   "params/params/encoderblock_1/MultiHeadDotProductAttention_0: "
                                   "split on its heads dim")
    assert reasons["Dense_0"] == ("Dense_0/kernel, the first of the MLP pair Dense_0/kernel "
                                  "[16, 32] then Dense_1/kernel [32, 16]: split on its output dim")


def test_megatron_refuses_a_selector_that_selects_nothing():
    """As in `ManualPartition`: a `column=`, `column_bias=` or `row=`
    selector that selects no argument is an error naming it and listing
    the arguments, not silently ignored."""
    module = _module()
    tactic = partir.Megatron("model", column=["params/w1"], row=["params/w2", "params/w_out"])
    with pytest.raises(partir.TacticError, match=r"Megatron row=: no argument matches "
                       r"'params/w_out'; the arguments are: params/b1, params/b2, params/w1"):
        partir.partition(module, partir.Mesh({"model": 2}), [tactic])


def test_megatron_leaves_a_scalar_named_like_a_weight_whole():
    """A conventional name on a scalar (a counter called `value`, a bias
    `b1` of rank 0) is passed over with why, never a failure."""
    params = {"attn": {"value": np.float32(2.0), "wq": np.ones((16, 8), np.float32)},
              "b1": np.float32(1.0)}

    def forward(params, x):
        return x @ params["attn"]["wq"] * params["attn"]["value"] + params["b1"]

    module = partir.import_jax(forward, params, np.ones((4, 16), np.float32))
    view = ProgramView.of(entry_function(module))
    plan = partir.Megatron("model").plan(view, partir.Mesh({"model": 2}))
    assert [(slash_path(t.leaf.name), t.dim) for t in plan] == [("params/attn/wq", 1)]


def test_a_tactic_prints_as_its_short_call():
    """Defaults are not printed (Megatron has ~250 default selectors)."""
    assert repr(partir.Megatron("model")) == "Megatron('model')"
    assert repr(partir.ZeRO("batch", 1)) == "ZeRO('batch', stage=1)"
    assert repr(partir.BatchParallel("b", inputs="x/**")) == "BatchParallel('b', inputs='x/**')"
    assert repr(partir.Megatron("m", row=("w2",))) == "Megatron('m', row=('w2',))"
    assert repr(partir.Automatic(profile="h100-8", progress=False)) == (
        "Automatic(profile='h100-8', progress=False)"
    )
    assert eval(repr(partir.ZeRO("batch", 2)), vars(partir)) == partir.ZeRO("batch", 2)
