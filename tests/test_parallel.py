"""sparse_jax.parallel: mesh sizes from configs, the logical-axis rules, batch rows."""

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from sparse_jax import parallel
from sparse_jax.validation import ConfigError


@pytest.mark.parametrize("section, devices, expected", [
    ({"data": -1, "fsdp": 1, "expert": 1}, 8, (8, 1, 1)),
    ({"data": 2, "fsdp": -1, "expert": 2}, 8, (2, 2, 2)),
    ({"data": 1, "fsdp": 1, "expert": 4}, 8, (1, 1, 4)),  # uses 4 of the 8 devices
    ({}, 8, (1, 1, 1)),
])
def test_mesh_shape_from_a_config_section(section, devices, expected):
  assert parallel.mesh_shape(section, devices) == expected


@pytest.mark.parametrize("section, message", [
    ({"data": 0}, "mesh.data must be a positive integer or -1"),
    ({"data": -1, "expert": -1}, "at most one of"),
    ({"data": 4, "fsdp": 4}, "exceeds the 8 devices"),
])
def test_bad_mesh_sections_name_the_field(section, message):
  with pytest.raises(ConfigError, match=message):
    parallel.mesh_shape(section, 8)


def test_logical_axes_rules():
  # A MoE expert weight: experts first, then FSDP on the largest remaining dimension.
  assert parallel.logical_axes("w_up", (8, 64, 32), 4) == ("experts", "fsdp", None)
  assert parallel.logical_axes("w_down", (8, 32, 64), 1) == ("experts", None, None)
  # Other arrays: FSDP on the largest dimension it divides; ties go to the first.
  assert parallel.logical_axes("embedding", (256, 64), 4) == ("fsdp", None)
  assert parallel.logical_axes("kernel", (64, 64), 4) == ("fsdp", None)
  assert parallel.logical_axes("kernel", (66, 64), 4) == (None, "fsdp")
  assert parallel.logical_axes("scale", (6,), 4) == (None,)  # nothing divisible: replicated
  assert parallel.logical_axes("count", (), 4) == ()
  assert parallel.to_mesh_axes(("experts", "fsdp", None)) == P("expert", "fsdp", None)
  assert parallel.to_mesh_axes(("batch", None)) == P(parallel.BATCH_AXES, None)


def test_state_shardings_follow_the_parameter_names():
  mesh = parallel.make_mesh((1, 2, 4))
  state = {"ff": {"w_up": jax.ShapeDtypeStruct((8, 16, 6), np.float32)},
           "norm": {"scale": jax.ShapeDtypeStruct((6,), np.float32)},
           "rng": jax.ShapeDtypeStruct((), jax.random.key(0).dtype)}
  shardings = parallel.state_shardings(state, mesh)
  assert shardings["ff"]["w_up"].spec == P("expert", "fsdp", None)
  assert shardings["norm"]["scale"].spec == P("fsdp")
  assert shardings["rng"].spec == P()


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
