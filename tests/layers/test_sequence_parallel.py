"""Sequence parallelism (`layers.sequence_parallel`): the dense, top-k, PKM and sigma-MoE FFs,
the XL attention (XLA and fused), SwitchHead (RoPE and XL) and Scaling Transformers' sparse
QKV and sparse FF on sequence shards equal the same layers unsplit (values and gradients, 8
simulated CPU devices), their compiled programs all-gather and reduce-scatter activations (never a weight,
never an all-reduce of activations), and the config check refuses lengths `tensor` does not
divide.

Tolerances: only the order of float32 sums differs (each device's partial sum over its heads
or hidden units, then the reduce-scatter), rtol 1e-5 on outputs of magnitude ~1."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from lm_testing import tiny_lm_config

from sparse_jax import parallel
from sparse_jax.aot.collectives import collectives
from sparse_jax.layers import sequence_parallel
from sparse_jax.layers.dense_ff import DenseFF
from sparse_jax.layers.moe import SigmaMoE
from sparse_jax.layers.pkm import PKM
from sparse_jax.layers.sparse_ff import SparseFF
from sparse_jax.layers.sparse_qkv_attention import SparseQKVAttention
from sparse_jax.layers.switchhead_attention import SwitchHeadAttention, SwitchHeadXLAttention
from sparse_jax.layers.topk_ff import TopKFF
from sparse_jax.layers.xl_attention import RelativeMultiHeadAttention
from sparse_jax.tasks import validate_config
from sparse_jax.validation import ConfigError

B, T, M, D = 4, 8, 8, 16


def _placed(module, mesh):
  """`module`'s parameters in the shardings their logical axes give on `mesh`."""
  graphdef, state = nnx.split(module)
  return nnx.merge(graphdef, jax.device_put(state, parallel.state_shardings(state, mesh)))


def _ff(ff):
  """An FF layer on one input."""

  def loss(ff, x_btd):
    y_btd, _ = ff(x_btd)
    return jnp.sum(jnp.sin(y_btd)), y_btd

  return ff, loss, (jax.random.normal(jax.random.key(1), (B, T, D)),)


def _dense_ff():
  return _ff(DenseFF(D, 32, n_layers=2, rngs=nnx.Rngs(0)))


def _topk_ff():
  """Top-K of 32 hidden units, K 3: each device's 4 units or fewer compete across devices."""
  return _ff(TopKFF(D, 32, 3, n_layers=2, rngs=nnx.Rngs(0)))


def _pkm_dense():
  """PKM read as a matrix: 16 values, knn covering the 4 sub-keys (the authors' dense path),
  softmax over all the values (a max and a sum over the devices' rows)."""
  return _ff(PKM(D, 4, 4, n_layers=2, n_heads=2, activation="softmax", rngs=nnx.Rngs(0)))


def _pkm_gathered():
  """PKM's top-knn read gathered from a table of 256 values, each device its own rows."""
  pkm = PKM(D, 16, 2, n_layers=2, n_heads=2, rngs=nnx.Rngs(0))
  assert not pkm.dense_read
  return _ff(pkm)


def _sigma_moe():
  """sigma-MoE (4 experts of 16, k 2; XLA's grouped matmul): its loss adds the entropy
  regulariser, so the router's gradients are compared too."""
  moe = SigmaMoE(D, 4, 16, 2, n_layers=2, impl="blocked", rngs=nnx.Rngs(0))

  def loss(moe, x_btd):
    y_btd, aux = moe(x_btd)
    return jnp.sum(jnp.sin(y_btd)) + aux["reg_loss"], y_btd

  return moe, loss, (jax.random.normal(jax.random.key(1), (B, T, D)),)


def _two_inputs(first_len: int) -> tuple[jax.Array, jax.Array]:
  keys = jax.random.split(jax.random.key(1))
  return (jax.random.normal(keys[0], (B, first_len, D)),
          jax.random.normal(keys[1], (B, T, D)))


def _on_context(attn):
  """An XL attention layer on its context given in parts (memory, segment), as the decoder
  block gives them under sequence parallelism."""

  def loss(attn, mem_bmd, x_btd):
    y_btd = attn((mem_bmd, x_btd), T, jnp.asarray(M - 3))
    return jnp.sum(jnp.sin(y_btd)), y_btd

  return attn, loss, _two_inputs(M)


def _xl_attention():
  return _on_context(RelativeMultiHeadAttention(D, 8, 2, n_layers=2, bias_init_std=0.1,
                                                impl="xla", rngs=nnx.Rngs(0)))


def _fused_xl_attention():
  """The fused XL attention (Pallas, in interpret mode here) on each device's rows and heads
  of the gathered context's projections."""
  return _on_context(RelativeMultiHeadAttention(D, 8, 2, n_layers=2, bias_init_std=0.1,
                                                impl="pallas", rngs=nnx.Rngs(0)))


def _switchhead_xl():
  """SwitchHead's Transformer-XL form (8 heads of 4 channels, 4 V and O experts each, 2
  active; XLA's grouped matmul)."""
  return _on_context(SwitchHeadXLAttention(D, 8, 4, 4, 2, n_layers=2, impl="blocked",
                                           rngs=nnx.Rngs(0)))


def _switchhead():
  """SwitchHead with RoPE (as `_switchhead_xl`), values reading the raw residual as in MoEUT
  (`v_btd`)."""
  attn = SwitchHeadAttention(D, 8, 4, 4, 2, n_layers=2, rope_fraction=1.0, impl="blocked",
                             rngs=nnx.Rngs(0))

  def loss(attn, x_btd, v_btd):
    y_btd, _ = attn.apply_with_aux(x_btd, v_btd)
    return jnp.sum(jnp.sin(y_btd)), y_btd

  return attn, loss, _two_inputs(T)


def _sparse_ff_and_qkv():
  """Scaling Transformers' sparse QKV attention (8 modules and heads) then sparse FF (8
  blocks of 4; evaluation mode: each block's unit chosen by the controller's argmax)."""
  attn = SparseQKVAttention(D, 8, n_layers=2, n_modules=8, rngs=nnx.Rngs(0))
  ff = SparseFF(D, 32, 4, 8, n_layers=2, rngs=nnx.Rngs(1))
  ff.eval()
  layers = nnx.List([attn, ff])

  def loss(layers, x_btd):
    y_btd, _ = layers[1](x_btd + layers[0](x_btd))
    return jnp.sum(jnp.sin(y_btd)), y_btd

  return layers, loss, (jax.random.normal(jax.random.key(1), (B, T, D)),)


def _value_and_grads(layer, loss, inputs, mesh=None, sequence=True):
  """The loss, output and gradients (parameters and inputs) of `loss`, unsplit without
  `mesh`; on `mesh` inside a `scope(sequence)`, the inputs on sequence shards if
  `sequence`, else whole."""
  grad_fn = nnx.value_and_grad(loss, argnums=(0, *range(1, 1 + len(inputs))), has_aux=True)
  if mesh is None:
    return nnx.jit(grad_fn)(layer, *inputs)
  with jax.set_mesh(mesh), sequence_parallel.scope(sequence):
    layer = _placed(layer, mesh)
    axes = ("batch", "length" if sequence else None, None)
    inputs = [jax.device_put(x, jax.NamedSharding(mesh, parallel.partition_spec(
        axes, mesh=mesh))) for x in inputs]
    return nnx.jit(grad_fn)(layer, *inputs)


@pytest.mark.parametrize("make", [_dense_ff, _topk_ff, _pkm_dense, _pkm_gathered, _sigma_moe,
                                  _xl_attention, _fused_xl_attention, _switchhead,
                                  _switchhead_xl, _sparse_ff_and_qkv],
                         ids=["dense_ff", "topk_ff", "pkm_dense", "pkm_gathered", "sigma_moe",
                              "xl_attention", "fused_xl_attention", "switchhead",
                              "switchhead_xl", "sparse_ff_and_qkv"])
@pytest.mark.parametrize("shape, sequence", [
    ((1, 1, 1, 8), True), ((2, 1, 1, 4), True), ((1, 2, 1, 4), True), ((2, 1, 1, 4), False)])
def test_on_sequence_shards_equals_unsplit(make, shape, sequence):
  """And without sequence parallelism (`sequence` False): the explicit tensor-parallel
  edges, the inputs whole."""
  layer, loss, inputs = make()
  (want_loss, want_y), want_grads = _unsplit(make)
  (got_loss, got_y), got_grads = _leaves(_value_and_grads(layer, loss, inputs,
                                                          parallel.make_mesh(shape), sequence))
  np.testing.assert_allclose(got_y, want_y, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(got_loss, want_loss, rtol=1e-5)
  for g, w in zip(got_grads, want_grads):
    np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-6 * float(np.abs(w).max()))


@pytest.mark.parametrize("shape", [(1, 2, 2, 2), (1, 1, 4, 2)])
def test_sigma_moe_on_sequence_shards_with_expert_parallelism_equals_unsplit(shape):
  """The experts split over `expert` too: the token slots travel to their expert's devices
  and back, then the `G` slices' sums are reduce-scattered along T."""
  test_on_sequence_shards_equals_unsplit(_sigma_moe, shape, True)


def _leaves(result):
  """`(loss, y), grads` with the gradients (parameters', then the inputs') as host arrays."""
  (loss, y), grads = result
  return (loss, y), jax.device_get(jax.tree.leaves(nnx.to_pure_dict(grads[0]))
                                   + list(grads[1:]))


@functools.cache
def _unsplit(make):
  """`make`'s layer unsplit: the reference every mesh's test compares with (compiled once
  per test process)."""
  return _leaves(_value_and_grads(*make()))


def _step_collectives(make) -> list:
  """The collectives of `make`'s FF layer's compiled gradient step on `tensor=4` under
  sequence parallelism (its input on sequence shards)."""
  layer, loss, inputs = make()
  mesh = parallel.make_mesh((1, 1, 1, 4))
  grad_fn = nnx.value_and_grad(loss, argnums=(0, 1), has_aux=True)
  with jax.set_mesh(mesh), sequence_parallel.scope(True):
    layer = _placed(layer, mesh)
    x = jax.device_put(inputs[0], jax.NamedSharding(mesh, jax.P(None, "tensor")))
    return collectives(nnx.jit(grad_fn).lower(layer, x).compile().as_text())


def test_compiled_moves_activations_by_all_gather_and_reduce_scatter():
  """The dense FF's step on `tensor=4`: forward one all-gather of `x` and one
  reduce-scatter of `y`, backward their transposes; no weight moved (the weights' gradients
  stay on their device: the batch is not split). The one other collective: the all-reduce of
  the output bias's gradient `[d]`, summed over each device's positions (as Megatron's
  sequence-parallel LayerNorm and bias gradients)."""
  found = sorted((c.kind, c.shape, c.backward) for c in _step_collectives(_dense_ff) if c.shape)
  assert found == [("all-gather", (B, T, D), False), ("all-gather", (B, T, D), True),
                   ("all-reduce", (D,), True), ("reduce-scatter", (B, T // 4, D), False),
                   ("reduce-scatter", (B, T // 4, D), True)]


@pytest.mark.parametrize("make", [_topk_ff, _pkm_dense, _pkm_gathered],
                         ids=["topk_ff", "pkm_dense", "pkm_gathered"])
def test_top_k_and_pkm_reduce_scatter_their_output(make):
  """Their steps on `tensor=4`: the sequence gathered once forward and the output's partial
  sums reduce-scattered, never all-reduced; what else moves is small: top-K's candidates
  `[B, T, t K]`, PKM's softmax statistics and its scores' gradients `[B T, H, ...]`."""
  found = _step_collectives(make)
  forward = sorted((c.kind, c.shape) for c in found if not c.backward
                   and len(c.shape) == 3 and c.shape[-1] == D)
  assert forward == [("all-gather", (B, T, D)), ("reduce-scatter", (B, T // 4, D))]
  assert all(np.prod(c.shape) < B * T * D for c in found if c.kind == "all-reduce")


def test_xl_attention_all_reduces_its_context_gradient_once():
  """Without sequence parallelism, on `tensor=4`: forward one all-reduce (the output
  projection's partial sums), backward one of the context's gradient `[B, M + T, d]` (Q's
  and K/V's summed on each device first: the partitioner all-reduced them apart)."""
  layer, _, (mem_bmd, x_btd) = _xl_attention()

  def loss(attn, ctx_bkd):  # One context, as the decoder block gives it.
    return jnp.sum(jnp.sin(attn(ctx_bkd, T, jnp.asarray(M))))

  mesh = parallel.make_mesh((1, 1, 1, 4))
  with jax.set_mesh(mesh), sequence_parallel.scope(False):
    layer = _placed(layer, mesh)
    ctx_bkd = jnp.concatenate([mem_bmd, x_btd], axis=1)
    text = nnx.jit(nnx.grad(loss, argnums=(0, 1))).lower(layer, ctx_bkd).compile().as_text()
  found = sorted((c.kind, c.shape, c.backward) for c in collectives(text) if len(c.shape) == 3)
  assert found == [("all-reduce", (B, T, D), False), ("all-reduce", (B, M + T, D), True)]


@pytest.fixture
def sp_config(tmp_path):
  """The tiny dense XL LM on tensor 2 with sequence parallelism."""
  config = tiny_lm_config(str(tmp_path), str(tmp_path / "tfds"))
  config.mesh.tensor = 2
  config.model.update(sequence_parallel=True, n_heads=2)
  config.model.ff = {"kind": "dense", "d_ff": 64}
  return config


def test_the_config_check_passes_the_split_layers(sp_config):
  validate_config(sp_config)
  sp_config.model.update(attention="causal", mem_len=0)
  validate_config(sp_config)
  sp_config.model.ff = {"kind": "sigma_moe", "n_experts": 4, "expert_size": 16, "k": 2,
                        "reg_coef": 0.001}
  validate_config(sp_config)
  sp_config.model.update(attention="sparse_qkv", n_heads=4, attention_sparsity=2)
  sp_config.model.ff = {"kind": "sparse_ff", "d_ff": 64, "block_size": 32}
  validate_config(sp_config)
  sp_config.model.update(attention="xl", mem_len=16, attention_impl="pallas",
                         attention_sparsity=None)
  for ff in ({"kind": "pkm", "n_subkeys": 4, "knn": 2, "n_heads": 2},
             {"kind": "topk", "d_ff": 64, "k": 8}):
    sp_config.model.ff = ff
    validate_config(sp_config)


@pytest.mark.parametrize("change, message", [
    ({"data.seq_len": 15}, r"'data.seq_len' must be divisible by mesh.tensor=2 with "
                           r"model.sequence_parallel.*got 15"),
    ({"model.mem_len": 15}, r"'model.mem_len' must be divisible by mesh.tensor=2"),
    ({"eval.mem_len": 33}, r"'eval.mem_len' must be divisible by mesh.tensor=2"),
])
def test_the_config_check_refuses_what_is_not_split(sp_config, change, message):
  for field, value in change.items():
    section, name = field.split(".")
    sp_config[section][name] = value
  with pytest.raises(ConfigError, match=message):
    validate_config(sp_config)
