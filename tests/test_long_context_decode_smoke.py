"""benchmarks/long_context_decode.py at toy sizes: its synthetic LSH cache is the one decoding
would have written, and the benchmark writes its table (timings are not checked here)."""

import json

import jax
import numpy as np
from flax import nnx

from benchmarks import long_context_decode
from sparse_jax.layers.lsh_attention import LSHSelfAttention

TOY = ["--d_model=32", "--n_heads=2", "--layers=1", "--d_ff=64", "--block_size=16",
       "--chunk_len=16", "--vocab_size=64", "--repeats=2"]


def test_synthetic_lsh_cache_equals_the_one_record_token_writes():
  attn = LSHSelfAttention(16, 2, n_layers=1, n_hashes=2, n_buckets=4, chunk_len=8,
                          rngs=nnx.Rngs(0))
  length = 40
  empty = attn.init_cache(1, length + 1, jax.numpy.float32)
  synthetic = long_context_decode.lsh_cache(attn, empty, jax.random.key(3), length)

  # The same random tokens recorded one at a time, as decoding does.
  k_qk, k_v = jax.random.split(jax.random.key(3))
  qk_blhc = jax.random.normal(k_qk, (1, length, 2, 8))
  v_bhlc = jax.random.normal(k_v, (1, 2, length, 8))
  recorded = empty
  for t in range(length):
    recorded = attn.record_token(qk_blhc[:, t:t + 1], v_bhlc[:, :, t][:, None], recorded,
                                 jax.numpy.int32(t))
  for name in ("buckets", "index", "counts"):
    np.testing.assert_array_equal(synthetic[name], recorded[name], err_msg=name)
  for name in ("k", "v"):
    np.testing.assert_allclose(synthetic[name], recorded[name], rtol=1e-6, err_msg=name)
  assert int(synthetic["counts"].sum()) == 2 * 2 * length  # heads x rounds x tokens


def test_benchmark_writes_its_table(tmp_path, capsys):
  out = tmp_path / "long_context.json"
  result = long_context_decode.main([*TOY, "--contexts=96", f"--out={out}"])
  assert json.loads(out.read_text()) == result
  rows = {(r["context"], r["model"]): r for r in result["rows"]}
  assert set(rows) == {(96, m) for m in long_context_decode.MODELS}
  assert all(r["ms_per_token"] > 0 for r in rows.values())
  assert rows[(96, "transformer")]["keys_read"] == 97
  assert 0 < rows[(96, "terraformer")]["keys_read"] <= result["budget_keys"] == 64
  assert "dense / terraformer" in capsys.readouterr().out
