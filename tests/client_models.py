"""Training steps written with the model libraries users bring: flax linen,
haiku and equinox layers, optimized with optax, their parameter trees named
by the libraries themselves (`params/Dense_0/kernel`, `params['mlp/~/linear_0']['w']`,
`params.layers[0].weight`).

Each model is a `Client`: its `step(params, opt_state, x, y)` returns
`(loss, params, opt_state)`, `make_args()` gives arguments of real shapes
(small enough to partition in a few seconds), and `megatron` is the
tensor-parallel tactic a user writes for it. Each library is imported only
by the function that builds its model, so a test can skip one that is not
installed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import partir

BATCH, SEQ, WIDTH, HEADS, HIDDEN, LAYERS = 8, 4, 16, 2, 32, 2


@dataclass(frozen=True)
class Client:
    """One library's training step, its arguments and its Megatron tactic."""

    name: str
    step: Callable[..., Any]
    init: Callable[[], tuple[Any, ...]]
    """Fresh (params, opt_state, x, y), as the library initializes them."""
    megatron: partir.Tactic

    def make_args(self, steps: int = 2) -> tuple[Any, ...]:
        """The arguments `steps` steps into training (`jax.jit`): Adam's first
        update is the learning rate times the gradient's sign, which turns
        the rounding of a gradient near zero into a whole step; later
        updates weigh the gradient against the ones before."""
        params, opt_state, x, y = self.init()
        step = jax.jit(self.step)
        for _ in range(steps):
            _, params, opt_state = step(params, opt_state, x, y)
        return params, opt_state, x, y


def _tokens(seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((BATCH, SEQ, WIDTH)).astype(np.float32)
    return x, rng.standard_normal((BATCH, SEQ, WIDTH)).astype(np.float32)


def _optax_step(apply: Callable[..., Any], optimizer: Any) -> Callable[..., Any]:
    """`value_and_grad` of the mean squared error of `apply(params, x)`, then
    the optax update: one training step.

    (The attention layers have no biases: a key bias's gradient is exactly
    zero, and Adam's first step turns that rounding noise into updates of
    the full learning rate, which no two summation orders agree on.)"""
    import optax

    def step(params, opt_state, x, y):
        def loss(params):
            return jnp.mean(jnp.square(apply(params, x) - y))

        value, grads = jax.value_and_grad(loss)(params)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return value, optax.apply_updates(params, updates), opt_state

    return step


# --------------------------------------------------------------------------
# flax linen: a pre-norm transformer block (Dense, LayerNorm,
# MultiHeadDotProductAttention) trained with optax's Adam


def _flax_block_class() -> type:
    import flax.linen as nn

    class Block(nn.Module):
        @nn.compact
        def __call__(self, x, _=None):  # (carry, per-layer input) under nn.scan
            h = nn.LayerNorm()(x)
            x = x + nn.MultiHeadDotProductAttention(num_heads=HEADS, use_bias=False)(h, h)
            h = nn.gelu(nn.Dense(HIDDEN)(nn.LayerNorm()(x)))
            return x + nn.Dense(WIDTH)(h), None

    return Block


FLAX_MEGATRON = partir.ManualPartition({
    "params/**/query/kernel": {-2: "model"},
    "params/**/key/kernel": {-2: "model"},
    "params/**/value/kernel": {-2: "model"},
    "params/**/out/kernel": {-3: "model"},
    "params/**/Dense_0/kernel": {-1: "model"},
    "params/**/Dense_0/bias": {-1: "model"},
    "params/**/Dense_1/kernel": {-2: "model"},
})
"""Megatron for flax, by hand: its Dense layers are named by position, and
attention keeps the heads as a kernel dim of their own (`[in, heads,
head_dim]` for q/k/v, `[heads, head_dim, out]` out): split the heads and the
MLP's hidden units (dims from the end, so a stack's layer dim is left
alone). Default `Megatron` finds the same by structure (`partir.blocks`)."""


def _flax_client(name: str, module: Any, seed: int) -> Client:
    import optax

    optimizer = optax.adam(1e-2)

    def init():
        x, y = _tokens(seed)
        params = jax.jit(module.init)(jax.random.key(seed), x)
        return params, optimizer.init(params), x, y

    def apply(params, x):
        return module.apply(params, x)[0]

    return Client(name, _optax_step(apply, optimizer), init, FLAX_MEGATRON)


def flax_block() -> Client:
    return _flax_client("flax", _flax_block_class()(), 0)


def flax_scanned_stack() -> Client:
    """`LAYERS` blocks under `nn.scan`: each parameter gets a leading layer dim."""
    import flax.linen as nn

    stack = nn.scan(
        _flax_block_class(), variable_axes={"params": 0}, split_rngs={"params": True},
        length=LAYERS,
    )
    return _flax_client("flax nn.scan", stack(), 3)


# --------------------------------------------------------------------------
# haiku: a transformer block (hk.MultiHeadAttention, hk.nets.MLP) under
# hk.transform, trained with optax's Adam


def _haiku_block(x):
    import haiku as hk

    h = hk.LayerNorm(-1, create_scale=True, create_offset=True)(x)
    attention = hk.MultiHeadAttention(
        num_heads=HEADS, key_size=WIDTH // HEADS, with_bias=False,
        w_init=hk.initializers.VarianceScaling(),
    )
    x = x + attention(h, h, h)
    h = hk.LayerNorm(-1, create_scale=True, create_offset=True)(x)
    return x + hk.nets.MLP([HIDDEN, WIDTH], activation=jax.nn.gelu)(h)


def haiku_block() -> Client:
    import haiku as hk
    import optax

    model, optimizer = hk.without_apply_rng(hk.transform(_haiku_block)), optax.adam(1e-2)

    def init():
        x, y = _tokens(1)
        params = jax.jit(model.init)(jax.random.key(1), x)
        return params, optimizer.init(params), x, y

    # haiku names a module by its path in one key ('multi_head_attention/query',
    # 'mlp/~/linear_0'), the out-projection and the MLP's layers by kind and
    # position: name the Megatron weights by their paths.
    attention = [f"params['multi_head_attention/{n}']['w']" for n in ("query", "key", "value")]
    megatron = partir.Megatron(
        "model",
        column=[*attention, "params['mlp/~/linear_0']['w']"],
        column_bias=["params['mlp/~/linear_0']['b']"],
        row=["params['multi_head_attention/linear']['w']", "params['mlp/~/linear_1']['w']"],
    )
    return Client("haiku", _optax_step(model.apply, optimizer), init, megatron)


def haiku_layer_stack() -> Client:
    """`LAYERS` blocks under `hk.layer_stack`, haiku's scan over stacked
    layers (its parameters: `params['__layer_stack_no_per_layer/...']`)."""
    import haiku as hk
    import optax

    def forward(x):
        return hk.layer_stack(LAYERS)(_haiku_block)(x)

    model, optimizer = hk.without_apply_rng(hk.transform(forward)), optax.adam(1e-2)

    def init():
        x, y = _tokens(2)
        params = jax.jit(model.init)(jax.random.key(2), x)
        return params, optimizer.init(params), x, y

    return Client(
        "haiku layer_stack", _optax_step(model.apply, optimizer), init, partir.Megatron("model")
    )


# --------------------------------------------------------------------------
# equinox: a transformer block of eqx.nn layers (LayerNorm, MultiheadAttention,
# Linear) in an eqx.Module, eqx.filter_value_and_grad, optax's Adam


def _equinox_block_class() -> type:
    import equinox as eqx

    class Block(eqx.Module):
        norm1: eqx.nn.LayerNorm
        attention: eqx.nn.MultiheadAttention
        norm2: eqx.nn.LayerNorm
        fc1: eqx.nn.Linear
        fc2: eqx.nn.Linear

        def __init__(self, key):
            k1, k2, k3 = jax.random.split(key, 3)
            self.norm1, self.norm2 = eqx.nn.LayerNorm(WIDTH), eqx.nn.LayerNorm(WIDTH)
            self.attention = eqx.nn.MultiheadAttention(HEADS, WIDTH, key=k1)
            self.fc1 = eqx.nn.Linear(WIDTH, HIDDEN, key=k2)
            self.fc2 = eqx.nn.Linear(HIDDEN, WIDTH, key=k3)

        def __call__(self, x):  # one sequence [SEQ, WIDTH]: equinox layers are vmapped
            h = jax.vmap(self.norm1)(x)
            x = x + self.attention(h, h, h)
            h = jax.nn.gelu(jax.vmap(self.fc1)(jax.vmap(self.norm2)(x)))
            return x + jax.vmap(self.fc2)(h)

    return Block


def _equinox_step(forward: Callable[..., Any], optimizer: Any) -> Callable[..., Any]:
    """`eqx.filter_value_and_grad` of the mean squared error of
    `forward(params, sequence)` over the batch, then the optax update."""
    import equinox as eqx

    def step(params, opt_state, x, y):
        @eqx.filter_value_and_grad
        def loss(params):
            return jnp.mean(jnp.square(jax.vmap(lambda s: forward(params, s))(x) - y))

        value, grads = loss(params)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return value, eqx.apply_updates(params, updates), opt_state

    return step


def equinox_block() -> Client:
    import equinox as eqx
    import optax

    optimizer = optax.adam(1e-2)
    block = eqx.filter_jit(_equinox_block_class())(jax.random.key(2))
    params, static = eqx.partition(block, eqx.is_array)

    def init():
        x, y = _tokens(2)
        return params, optimizer.init(params), x, y

    # equinox's names fit Megatron's conventions (query_proj, output_proj,
    # fc1, fc2); its Linear weights are [out, in], which Megatron knows.
    def forward(params, sequence):
        return eqx.combine(params, static)(sequence)

    return Client("equinox", _equinox_step(forward, optimizer), init, partir.Megatron("model"))


def equinox_scanned_stack() -> Client:
    """`LAYERS` blocks made by `eqx.filter_vmap` (each array leaf gets a
    leading layer dim) and run by `lax.scan`, equinox's way to stack layers."""
    import equinox as eqx
    import optax

    optimizer = optax.adam(1e-2)
    blocks = eqx.filter_jit(eqx.filter_vmap(_equinox_block_class()))(
        jax.random.split(jax.random.key(4), LAYERS)
    )
    params, static = eqx.partition(blocks, eqx.is_array)

    def forward(params, sequence):
        def layer(h, block):
            return eqx.combine(block, static)(h), None

        return jax.lax.scan(layer, sequence, params)[0]

    def init():
        x, y = _tokens(4)
        return params, optimizer.init(params), x, y

    return Client(
        "equinox scan", _equinox_step(forward, optimizer), init, partir.Megatron("model")
    )


# --------------------------------------------------------------------------
# flax NNX: a GPT (token and position embeddings, pre-norm blocks of
# nnx.MultiHeadAttention and an MLP, dropout) trained with nnx.Optimizer and
# optax's AdamW in NNX's functional form (nnx.split / nnx.merge): the step
# takes the state and returns it updated.

VOCAB = 32


def _nnx_gpt(seed: int) -> Any:
    from flax import nnx

    class Block(nnx.Module):
        def __init__(self, rngs: nnx.Rngs):
            self.ln1 = nnx.LayerNorm(WIDTH, rngs=rngs)
            self.attn = nnx.MultiHeadAttention(
                num_heads=HEADS, in_features=WIDTH, use_bias=False, decode=False, rngs=rngs
            )
            self.ln2 = nnx.LayerNorm(WIDTH, rngs=rngs)
            self.up = nnx.Linear(WIDTH, HIDDEN, rngs=rngs)
            self.down = nnx.Linear(HIDDEN, WIDTH, rngs=rngs)
            self.drop = nnx.Dropout(0.1, rngs=rngs)

        def __call__(self, x, mask):
            h = self.ln1(x)
            x = x + self.attn(h, mask=mask)
            return x + self.drop(self.down(nnx.gelu(self.up(self.ln2(x)))))

    class GPT(nnx.Module):
        def __init__(self, rngs: nnx.Rngs):
            self.wte = nnx.Embed(VOCAB, WIDTH, rngs=rngs)
            self.wpe = nnx.Embed(SEQ, WIDTH, rngs=rngs)
            self.blocks = nnx.List([Block(rngs) for _ in range(LAYERS)])
            self.ln_f = nnx.LayerNorm(WIDTH, rngs=rngs)
            self.lm_head = nnx.Linear(WIDTH, VOCAB, use_bias=False, rngs=rngs)

        def __call__(self, tokens):
            x = self.wte(tokens) + self.wpe(jnp.arange(tokens.shape[1]))
            mask = nnx.make_causal_mask(tokens)
            for block in self.blocks:
                x = block(x, mask)
            return self.lm_head(self.ln_f(x))

    return GPT(nnx.Rngs(seed, dropout=seed + 1))


def _nnx_tokens(seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    tokens, targets = (rng.integers(0, VOCAB, (BATCH, SEQ)).astype(np.int32) for _ in range(2))
    return tokens, targets


def _nnx_loss(model: Any, tokens: Any, targets: Any) -> Any:
    import optax

    logits = model(tokens)
    return optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean()


@dataclass(frozen=True)
class NNXClient:
    """An NNX training step in one of its functional forms, its arguments
    (two steps into training) and the hand-written Megatron (heads split)."""

    name: str
    step: Callable[..., Any]
    args: tuple[Any, ...]
    parameters: str
    """The selector root of the model's variables (`state/0`, `params`)."""

    @property
    def heads_split(self) -> partir.Tactic:
        """Megatron as a user writes it by hand for this model: q/k/v on
        their heads dim, out on its heads dim, the MLP column then row."""
        blocks = f"{self.parameters}/blocks/*"
        return partir.ManualPartition({
            f"{blocks}/attn/query/kernel": {-2: "model"},
            f"{blocks}/attn/key/kernel": {-2: "model"},
            f"{blocks}/attn/value/kernel": {-2: "model"},
            f"{blocks}/attn/out/kernel": {-3: "model"},
            f"{blocks}/up/kernel": {-1: "model"},
            f"{blocks}/up/bias": {-1: "model"},
            f"{blocks}/down/kernel": {-2: "model"},
        })


def _trained(step: Callable[..., Any], args: tuple[Any, ...], steps: int = 2) -> tuple[Any, ...]:
    """`args` after `steps` steps of `jax.jit(step)` (see `Client.make_args`)."""
    jitted = jax.jit(step)
    for _ in range(steps):
        _, *state = jitted(*args)
        args = (*state, *args[len(state):])
    return args


def nnx_gpt_one_state() -> NNXClient:
    """The model and the optimizer in one state argument,
    `nnx.split((model, optimizer))`: `step(state, tokens, targets)`."""
    import optax
    from flax import nnx

    model = _nnx_gpt(5)
    optimizer = nnx.Optimizer(model, optax.adamw(1e-2), wrt=nnx.Param)
    graphdef, state = nnx.split((model, optimizer))

    def step(state, tokens, targets):
        model, optimizer = nnx.merge(graphdef, state)
        loss, grads = nnx.value_and_grad(_nnx_loss)(model, tokens, targets)
        optimizer.update(model, grads)
        return loss, nnx.state((model, optimizer))

    return NNXClient("nnx one state", step, _trained(step, (state, *_nnx_tokens(5))), "state/0")


def nnx_gpt_split() -> NNXClient:
    """The model's state (its parameters and dropout's RNG counters) and
    the optimizer's in arguments of their own: `step(params, opt_state,
    tokens, targets)`."""
    import optax
    from flax import nnx

    model = _nnx_gpt(6)
    optimizer = nnx.Optimizer(model, optax.adamw(1e-2), wrt=nnx.Param)
    model_def, params = nnx.split(model)
    opt_def, opt_state = nnx.split(optimizer)

    def step(params, opt_state, tokens, targets):
        model, optimizer = nnx.merge(model_def, params), nnx.merge(opt_def, opt_state)
        loss, grads = nnx.value_and_grad(_nnx_loss)(model, tokens, targets)
        optimizer.update(model, grads)
        return loss, nnx.state(model), nnx.state(optimizer)

    args = _trained(step, (params, opt_state, *_nnx_tokens(6)))
    return NNXClient("nnx split", step, args, "params")
