"""benchmarks/step_dispatch.py runs end to end at toy sizes (timings are not checked), and
both carried forms of the state train alike."""

import json

import jax
import numpy as np
from flax import nnx

from benchmarks import step_dispatch
from benchmarks.lm_train_step import LMTrainStep
from sparse_jax import parallel


def test_step_dispatch_times_both_forms(tmp_path, capsys):
  out = tmp_path / "step_dispatch.json"
  result = step_dispatch.main(["--preset=tiny", "--rounds=2", f"--out={out}"])
  assert json.loads(out.read_text())["models"] == result["models"]
  for row in result["models"].values():
    assert set(row["dispatch_ms"]) == {"step/dicts", "step/nnx_state", "nothing/dicts",
                                       "nothing/nnx_state"}
    assert all(len(t) == 2 and min(t) > 0 for t in row["dispatch_seconds"].values())
  assert "| dense | 130 | step |" in capsys.readouterr().out


def test_the_state_forms_compute_the_same_steps():
  config = step_dispatch.bench_configs("default")["sigma_moe"]
  config.model.n_layers = 2
  mesh = parallel.make_mesh([1, 1, 1])
  with jax.set_mesh(mesh):
    step = LMTrainStep(config, mesh)
    batch = step.random_batch(np.random.default_rng(0))
    runs = step_dispatch.carriers(step, batch)
    for name in ("step/dicts", "step/nnx_state"):
      for index in range(2):
        runs[name](batch, index)
  dicts = runs["step/dicts"].state
  as_state = nnx.to_pure_dict(runs["step/nnx_state"].state)
  assert jax.tree.structure(dicts) == jax.tree.structure(as_state)
  for a, b in zip(jax.tree.leaves(dicts), jax.tree.leaves(as_state)):
    if jax.dtypes.issubdtype(a.dtype, jax.dtypes.prng_key):
      a, b = jax.random.key_data(a), jax.random.key_data(b)
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
