"""benchmarks/cvmm_profile.py at toy sizes on CPU (not a benchmark): its stages are the
layer's, so composing them gives `expert_mlp`'s output and input gradient."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from benchmarks import cvmm, cvmm_profile

SHAPE = dict(tokens=48, d_model=32, group=16, k=2, experts=6)


@pytest.mark.parametrize("impl", ["blocked", "ragged"])
def test_stages_compose_to_the_layer(impl):
  x, sel, gates, w1, w2, ct = cvmm.random_layer(jax.random.key(3), dtype=jnp.float32, **SHAPE)
  stages = {s.name: s for s in cvmm_profile.layer_stages(impl, x, sel, gates, w1, w2, ct)}
  y, vjp = jax.vjp(lambda x: cvmm.moe_layer(x, sel, gates, w1, w2, impl), x)
  (dx,) = vjp(ct)
  run = lambda name: np.asarray(stages[name].fn(*stages[name].args))
  np.testing.assert_allclose(run("gather-sum"), y, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(run("bwd: dx gather-sum"), dx, rtol=1e-5, atol=1e-6)
  assert stages["up matmul"].flops >= stages["up matmul"].useful_flops == (
      2.0 * SHAPE["tokens"] * SHAPE["k"] * SHAPE["d_model"] * SHAPE["group"])


def test_main_writes_a_table_per_point(tmp_path, capsys):
  out = tmp_path / "profile.json"
  points = cvmm_profile.main(["--experts", "4", "--tokens", "32", "--d_model", "32",
                              "--group", "16", "--k", "2", "--repeats", "1",
                              "--output", str(out)])
  assert [p["experts"] for p in points] == [4] and out.exists()
  stages = [r["stage"] for r in points[0]["stages"]]
  assert stages[0] == "routing" and stages[-1] == "bwd: up weight grad" and len(stages) == 16
  assert abs(sum(r["share"] for r in points[0]["stages"]) - 1) < 1e-9
  assert "| up matmul |" in capsys.readouterr().out
