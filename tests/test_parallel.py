"""sparse_jax.parallel: mesh sizes from configs, the logical-axis rules, batch rows."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from jax.sharding import AxisType
from jax.sharding import PartitionSpec as P

from sparse_jax import parallel
from sparse_jax.validation import ConfigError


@pytest.mark.parametrize("section, devices, expected", [
    ({"data": -1, "fsdp": 1, "expert": 1}, 8, (8, 1, 1, 1)),
    ({"data": 2, "fsdp": -1, "expert": 2}, 8, (2, 2, 2, 1)),
    ({"data": 1, "fsdp": 1, "expert": 4}, 8, (1, 1, 4, 1)),  # uses 4 of the 8 devices
    ({"data": -1, "tensor": 4}, 8, (2, 1, 1, 4)),  # -1: what tensor leaves
    ({}, 8, (1, 1, 1, 1)),
])
def test_mesh_shape_from_a_config_section(section, devices, expected):
  assert parallel.mesh_shape(section, devices) == expected


@pytest.mark.parametrize("section, message", [
    ({"data": 0}, "'mesh.data' must be a positive integer or -1"),
    ({"data": -1, "expert": -1}, "at most one of"),
    ({"dat": 2}, "'mesh.dat' is unknown; did you mean 'data'"),
    ({"data": 4, "fsdp": 4}, "exceeds the 8 devices"),
    ({"data": 2, "tensor": 8}, r"mesh.tensor = 16 .* exceeds the 8 devices"),
    ({"tensor": -1}, "'mesh.tensor' must be a positive integer"),
    ({"tensor": 0}, "'mesh.tensor' must be a positive integer"),
])
def test_bad_mesh_sections_name_the_field(section, message):
  with pytest.raises(ConfigError, match=message):
    parallel.mesh_shape(section, 8)


def test_partition_spec_applies_the_rules_in_order():
  mesh = parallel.make_mesh((1, 4, 2))  # fsdp 4, expert 2, tensor 1
  spec = functools.partial(parallel.partition_spec, mesh=mesh)
  # An expert weight: experts over `expert`, then fsdp on the first rule's axis it divides
  # (`mlp` is on the tensor axis of size 1 first: the same split as fsdp alone).
  assert spec(("experts", "embed", "mlp"), (8, 16, 6)) == P("expert", "fsdp", "tensor")
  assert spec(("experts", "mlp", "embed"), (8, 6, 16)) == P("expert", "tensor", "fsdp")
  assert spec(("experts", "embed", "mlp"), (8, 6, 16)) == P("expert", None, ("tensor", "fsdp"))
  # Experts that the expert axis does not divide stay whole; fsdp is unaffected.
  assert spec(("experts", "embed", "mlp"), (3, 16, 6)) == P(None, "fsdp", "tensor")
  # `embed` is the first fsdp rule, ahead of `vocab`, however large the vocabulary.
  assert spec(("vocab", "embed"), (256, 64)) == P("tensor", "fsdp")
  assert spec(("vocab", "embed"), (256, 6)) == P(("tensor", "fsdp"), None)
  # A router's selector rows are not split over `expert`.
  assert spec(("expert_scores", "embed"), (8, 6)) == P("fsdp", None)
  # One dimension per mesh axis: only the first divisible `memory` takes fsdp.
  assert spec(("memory", "memory", "embed"), (8, 4, 6)) == P("fsdp", None, None)
  assert spec(("memory", "memory", "embed"), (6, 4, 6)) == P(None, "fsdp", None)
  # Names without a rule are never split; nothing divisible: replicated.
  conv_axes = ("conv", "conv", "head_dim", "head_dim")
  assert spec(conv_axes, (4, 4, 8, 8)) == P(None, None, "fsdp", None)
  assert spec(("embed",), (6,)) == P(None)
  assert spec((), ()) == P()


def test_tensor_splits_heads_hidden_units_and_vocabulary_megatron_style():
  """Column-parallel Q/K/V (by head), row-parallel output (its input rows), the FF's and each
  expert's hidden units, the vocabulary; fsdp then takes `embed`; routers and the batch are
  not split over `tensor`."""
  mesh = parallel.make_mesh((1, 2, 1, 4))  # fsdp 2, tensor 4
  spec = functools.partial(parallel.partition_spec, mesh=mesh)
  assert spec(("embed", "heads", "head_dim"), (16, 8, 4)) == P("fsdp", "tensor", None)
  assert spec(("heads", "head_dim", "embed"), (8, 4, 16)) == P("tensor", None, "fsdp")
  assert spec(("heads", "head_dim"), (8, 4)) == P(("tensor", "fsdp"), None)  # XL u, v biases
  assert spec(("embed", "mlp"), (16, 32)) == P("fsdp", "tensor")
  assert spec(("mlp", "embed"), (32, 16)) == P("tensor", "fsdp")
  assert spec(("experts", "embed", "mlp"), (4, 16, 8)) == P("expert", "fsdp", "tensor")
  assert spec(("experts", "mlp", "embed"), (4, 8, 16)) == P("expert", "tensor", "fsdp")
  assert spec(("expert_scores", "embed"), (4, 16)) == P(None, "fsdp")
  assert spec(("vocab", "embed"), (256, 16)) == P("tensor", "fsdp")
  assert spec(("embed", "vocab"), (16, 256)) == P("fsdp", "tensor")
  assert spec(("vocab",), (256,)) == P(("tensor", "fsdp"))  # the output bias
  # What tensor does not divide stays whole over it; fsdp still takes what it divides.
  assert spec(("embed", "heads", "head_dim"), (16, 2, 4)) == P("fsdp", None, None)
  assert spec(("batch", None)) == P(parallel.BATCH_AXES, None)
  assert parallel.batch_shards(mesh) == 2 and parallel.axis_size(mesh, "tensor") == 4
  assert parallel.mesh_axes("mlp") == ("tensor", "fsdp")


def test_batch_axes_and_meshes_without_some_axes():
  assert parallel.partition_spec(("batch", None)) == P(parallel.BATCH_AXES, None)
  expert_only = jax.make_mesh((8,), ("expert",), axis_types=(AxisType.Auto,))
  assert parallel.mesh_axes("batch", expert_only) == ("expert",)
  assert parallel.partition_spec(("batch", None), mesh=expert_only) == P("expert", None)
  assert parallel.partition_spec(("embed", "mlp"), (8, 8), expert_only) == P(None, None)
  with pytest.raises(ValueError, match="unknown logical axes \\['embd'\\]"):
    parallel.partition_spec(("embd",))


class _Tiny(nnx.Module):
  """An expert weight and a parameter that declares no axes (named like an expert weight:
  names play no part), and a dropout with its RNG state."""

  def __init__(self, rngs):
    self.experts = nnx.Param(jnp.ones((8, 16, 6)), logical_axes=("experts", "embed", "mlp"))
    self.w_up = nnx.Param(jnp.ones((8, 16, 6)))
    self.dropout = nnx.Dropout(0.1, rngs=rngs)


def test_state_shardings_follow_the_declared_axes_also_for_adam_moments():
  model = _Tiny(nnx.Rngs(0))
  optimizer = nnx.Optimizer(model, optax.adam(1e-3), wrt=nnx.Param)
  _, state = nnx.split((model, optimizer))
  shardings = parallel.state_shardings(state, parallel.make_mesh((1, 2, 4)))
  model_shardings, optimizer_shardings = shardings[0], shardings[1]
  assert model_shardings["experts"].get_value().spec == P("expert", "fsdp", "tensor")
  assert model_shardings["w_up"].get_value().spec == P()
  assert model_shardings["dropout"]["rngs"]["key"].get_value().spec == P()
  adam = optimizer_shardings["opt_state"][0]
  for moments in (adam.mu, adam.nu):
    assert moments["experts"].get_value().spec == P("expert", "fsdp", "tensor")
    assert moments["w_up"].get_value().spec == P()
  assert adam.count.get_value().spec == P()


def test_adafactor_factored_moments_are_replicated():
  """Adafactor keeps row and column statistics (and `(1,)` placeholders) that carry the
  parameter's 3-axis metadata; they are replicated, its full-rank moments follow the axes."""
  model = _Tiny(nnx.Rngs(0))
  optimizer = nnx.Optimizer(model, optax.adafactor(1e-3, min_dim_size_to_factor=4),
                            wrt=nnx.Param)
  _, state = nnx.split((model, optimizer))
  shardings = parallel.state_shardings(state, parallel.make_mesh((1, 2, 4)))
  factored = shardings[1]["opt_state"][0]
  assert factored.v_row["experts"].get_value().spec == P()
  assert factored.v_col["experts"].get_value().spec == P()
  assert factored.v["experts"].get_value().spec == P()  # (1,): the moment is factored.


def test_axes_that_do_not_match_the_shape_raise():
  with pytest.raises(ValueError, match=r"declares logical axes \('embed',\) for an array of "
                                       r"shape \(4, 4\)"):
    parallel.state_shardings({"w": nnx.Param(jnp.ones((4, 4)), logical_axes=("embed",))},
                             parallel.make_mesh((1, 1, 1)))


def test_every_process_holds_contiguous_batch_rows():
  mesh = parallel.make_mesh((2, 2, 2))
  sharding = parallel.batch_sharding(mesh)
  assert parallel.local_rows(sharding, (16, 3)) == slice(0, 16)  # one process: all rows
  local = np.arange(48).reshape(16, 3)
  array = parallel.global_array(sharding, local, (16, 3))
  np.testing.assert_array_equal(np.asarray(array), local)
  assert len(array.addressable_shards) == 8
  assert all(s.data.shape == (2, 3) for s in array.addressable_shards)
  assert parallel.batch_shards(mesh) == 8 and parallel.axis_size(mesh, "fsdp") == 2
  assert parallel.axis_size(None, "expert") == 1
