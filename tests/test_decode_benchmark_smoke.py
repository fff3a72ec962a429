"""benchmarks/decode.py runs end to end at toy sizes (its timings are not checked here)."""

import json
import sys

import jax
import jax.numpy as jnp
from flax import nnx

from benchmarks import decode, op_profile
from sparse_jax.models.blocks import DecoderBlock
from sparse_jax.models.lm_config import validate_model_config


def test_decode_benchmark_writes_its_table(tmp_path, monkeypatch, capsys):
  out = tmp_path / "decode.json"
  monkeypatch.setattr(sys, "argv", ["decode.py", "--d_model=32", "--layers=1", "--context=4",
                                    "--repeats=2", "--bandwidth_mib=4", f"--out={out}"])
  decode.main()
  result = json.loads(out.read_text())
  assert [r["variant"] for r in result["rows"]] == list(decode.VARIANTS)
  assert all(r["block_ms"] > 0 and r["model_ms"] > 0 for r in result["rows"])
  assert all(r["x_roofline"] == r["block_ms"] / max(r["bytes_bound_ms"], r["flops_bound_ms"])
             for r in result["rows"])
  assert set(result["measured_peaks"]) == {"read_gb_s", "copy_gb_s", "matmul_gflop_s"}
  assert "sparse_ff_qkv" in capsys.readouterr().out


def test_decode_benchmark_on_a_tensor_mesh_counts_collectives_and_checks_tokens(tmp_path,
                                                                                capsys):
  """--tensor=2: the blocks split over 2 simulated devices; per token and block, the dense
  block all-reduces the attention's and the FF's partial outputs, `d_model` floats each, the
  sparse FF + QKV block all-gathers its heads (no output layer), all-reduces the FF's and
  exchanges neighbouring modules; each also all-reduces one scalar (the cache write waits
  for the attention's first output element, `causal_attention.index_after`). Both variants
  decode the same tokens as one device."""
  out = tmp_path / "decode_tensor.json"
  decode.main(["--d_model=32", "--n_heads=4", "--d_ff=256", "--block_size=16", "--layers=1",
               "--context=4", "--repeats=2", "--bandwidth_mib=4", "--tensor=2",
               "--variants=dense,sparse_ff_qkv", f"--out={out}"])
  rows = {r["variant"]: r for r in json.loads(out.read_text())["rows"]}
  assert sorted(rows) == ["dense", "sparse_ff_qkv"]
  assert all(r["same_tokens"] for r in rows.values())
  found = rows["sparse_ff_qkv"]["block_collectives"]
  assert found["all-gather"] == {"n": 1, "bytes": 32 * 4}
  assert found["all-reduce"] == {"n": 2, "bytes": 32 * 4 + 4}
  assert found["collective-permute"]["n"] > 0
  assert rows["dense"]["block_collectives"] == {"all-reduce": {"n": 3, "bytes": 2 * 32 * 4 + 4}}
  assert "same tokens" in capsys.readouterr().out


def test_bytes_read_counts_weights_once_chosen_ff_units_and_the_cache():
  """Written out from the layers' shapes: a dense block reads Q, K, V, O (4 d^2), two
  LayerNorms (4 d), the FF (2 d d_ff + d_ff + d) and the K, V cache (2 (context + 1) d); a
  SparseFF reads its controller (d r + r d_ff + d_ff), one unit of W1 and W2 per block of N
  (2 d d_ff / N) and b2 (d); float32."""
  d, d_ff, n, context = 32, 64, 8, 4
  shape = dict(d_model=d, n_heads=4, attention_sparsity=None, d_ff=d_ff, block_size=n)
  attention_norms_cache = 4 * d * d + 4 * d + 2 * (context + 1) * d
  expected = {"dense": attention_norms_cache + 2 * d * d_ff + d_ff + d,
              "sparse_ff": attention_norms_cache + d * (d_ff // n) + (d_ff // n) * d_ff + d_ff
                           + 2 * d * d_ff // n + d}
  for variant, floats in expected.items():
    cfg = validate_model_config(decode.model_config(variant, shape, 1))
    block = DecoderBlock(cfg, rngs=nnx.Rngs(0))
    cache = block.attn.init_cache(1, context + 1, jnp.float32)
    assert decode.bytes_read(block, cache) == 4 * floats, variant


def test_block_only_run_with_attention_sparsity_below_the_heads(tmp_path, capsys):
  """The 17b path (S != heads, block only) at a toy width: 6 heads over S = 4 modules."""
  out = tmp_path / "decode_17b.json"
  result = decode.main(["--shape=17b", "--d_model=24", "--n_heads=6", "--attention_sparsity=4",
                        "--d_ff=64", "--block_size=8", "--context=4", "--repeats=2",
                        "--bandwidth_mib=4", "--profile", f"--out={out}"])
  assert json.loads(out.read_text()) == result and result["block_only"]
  for row in result["rows"]:  # `--profile`: each block's slowest operations
    assert row["block_ops"] and all(op["ms"] > 0 for op in row["block_ops"]), row["variant"]
  assert [r["d_ff"] for r in result["rows"]] == [64, 64, 112, 112]  # + 2 d_model for QKV
  assert all(r["block_ms"] > 0 and "model_ms" not in r for r in result["rows"])
  assert result["paper_block_ms"] is None  # overridden shape: no paper column
  printed = capsys.readouterr().out
  assert "paper x" not in printed and "sparse_ff_qkv block (" in printed


def test_paper_shapes_validate_as_model_configs():
  """The presets themselves, parsed (not built: one 17b block is ~5 GB)."""
  big = validate_model_config(decode.model_config("sparse_ff_qkv", decode.SHAPES["17b"], 1))
  assert (big.d_model, big.n_heads, big.attention_sparsity, big.ff.block_size, big.ff.d_ff,
          big.positions) == (9216, 96, 64, 256, 49152 + 2 * 9216, "sinusoidal")
  small = validate_model_config(decode.model_config("sparse_qkv", decode.SHAPES["800m"], 1))
  assert (small.ff.d_ff, small.attention_sparsity) == (6144, None)  # the paper's 4096 -> 6144
  dense = validate_model_config(decode.model_config("dense", decode.SHAPES["17b"], 1))
  assert (dense.attention, dense.ff.kind, dense.ff.d_ff) == ("causal", "dense", 49152)


def test_op_profile_names_the_compiled_programs_operations():
  """Every profiled name is an instruction of the compiled HLO, and the slowest one (the
  matmul) takes longer on a 512^2 matrix than on a 128^2 one (64x the multiply-adds)."""
  small, big = (jnp.ones((n, n), jnp.float32) for n in (128, 512))
  matmul = jax.jit(lambda a: jnp.tanh(a @ a))
  for x in (small, big):
    jax.block_until_ready(matmul(x))
  hlo = matmul.lower(big).compile().as_text()
  ops = op_profile.per_op_ms(lambda: jax.block_until_ready(matmul(big)), calls=5)
  assert len(ops) >= 2 and all(f"%{name} = " in hlo for name, _ in ops), ops
  slowest, slowest_ms = ops[0]
  small_ops = dict(op_profile.per_op_ms(lambda: jax.block_until_ready(matmul(small)), 5))
  assert slowest_ms > 2 * small_ops[slowest]
