"""What every model's layers declare: the logical axes of each parameter, the FF contract.

Models are built with no mesh, as in a notebook (flax's own sharding metadata would raise
there); `sparse_jax.parallel.state_shardings` places their state on a mesh when asked.
"""

import jax
import optax
import pytest
from flax import nnx
from test_ff_kinds_in_lm import FF_CONFIGS, lm_config

from sparse_jax import parallel
from sparse_jax.layers import FeedForward
from sparse_jax.models import TransformerLM
from sparse_jax.models.classifier import SequenceClassifier
from sparse_jax.models.encoder import Encoder, roberta_base_config

SPARTAN = {"kind": "spartan", "n_parents": 4, "n_children": 2, "top_k": 2}


def lm(kind="dense", **overrides):
  cfg = lm_config(kind)
  cfg.update(overrides)
  return TransformerLM(cfg, rngs=nnx.Rngs(0))


def encoder_config():
  cfg = roberta_base_config()
  cfg.update(vocab_size=40, d_model=16, n_layers=2, n_heads=2, max_positions=20)
  cfg.ff.d_ff = 32
  cfg.memory = SPARTAN
  cfg.adapters = {"kind": "houlsby", "bottleneck": 4}
  return cfg


# Every FF kind, attention kind, output kind, plug-in and model class.
MODELS = {
    **{f"lm/{kind}": lambda kind=kind: lm(kind) for kind in FF_CONFIGS},
    "lm/causal/tied/spartan": lambda: lm(attention="causal", tie_embeddings=True,
                                         memory=SPARTAN),
    "lm/sparse_qkv/loss_sparsity": lambda: lm(attention="sparse_qkv", loss_sparsity=4),
    "encoder/houlsby/spartan": lambda: Encoder(encoder_config(), rngs=nnx.Rngs(0)),
    "classifier/encoder": lambda: SequenceClassifier(encoder_config(), 3, rngs=nnx.Rngs(0)),
    "classifier/lm": lambda: SequenceClassifier(lm_config("dense"), 3, rngs=nnx.Rngs(0)),
}


def variables(tree) -> dict:
  """`{path: Variable}` of a tree of NNX Variables."""
  leaves, _ = jax.tree_util.tree_flatten_with_path(
      tree, is_leaf=lambda x: isinstance(x, nnx.Variable))
  return {jax.tree_util.keystr(path): leaf for path, leaf in leaves}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_every_parameter_declares_its_axes_and_large_ones_split_on_a_mesh(name):
  assert jax.sharding.get_abstract_mesh().empty  # Built as in a notebook: no mesh.
  params = nnx.state(MODELS[name](), nnx.Param)
  shardings = variables(parallel.state_shardings(params, parallel.make_mesh((1, 2, 2))))
  for path, param in variables(params).items():
    axes = parallel.declared_axes(param)
    assert axes is not None, f"{path} declares no logical axes"
    assert len(axes) == param.ndim and set(axes) <= set(parallel.LOGICAL_AXES), (path, axes)
    # Every size here is even: each matrix is split over fsdp, the experts over expert.
    spec = shardings[path].get_value().spec  # An entry is an axis or a tuple of them.
    mesh_axes = {axis for entry in spec if entry
                 for axis in ((entry,) if isinstance(entry, str) else entry)}
    assert param.ndim < 2 or parallel.FSDP in mesh_axes, (path, axes, spec)
    assert (parallel.EXPERT in mesh_axes) == ("experts" in axes), (path, axes, spec)


def test_adam_moments_declare_the_axes_of_their_parameters():
  model = lm("sigma_moe")
  tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(1e-3))  # as the trainer's
  optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)
  want = {path: parallel.declared_axes(v)
          for path, v in variables(nnx.state(model, nnx.Param)).items()}
  adam = optimizer.opt_state[1][0]
  for moments in (adam.mu, adam.nu):
    assert {path: parallel.declared_axes(v) for path, v in variables(moments).items()} == want


@pytest.mark.parametrize("kind", sorted(FF_CONFIGS))
def test_every_ff_kind_is_a_feed_forward_and_declares_its_decode_path(kind):
  ff = lm(kind).blocks[0].ff
  assert isinstance(ff, FeedForward)
  assert ff.has_sparse_decode == (kind == "sparse_ff")
  assert callable(getattr(ff, "decode", None)) == ff.has_sparse_decode
