"""benchmarks/tensor_parallel_collectives.py compiles the dense, sigma-MoE, sparse FF + QKV and
SwitchHead training steps (the first two also sequence-parallel) on a simulated tensor=2
mesh at toy sizes and counts their collectives per layer."""

import json

from benchmarks import tensor_parallel_collectives


def test_collectives_benchmark_writes_its_table(tmp_path, capsys):
  out = tmp_path / "collectives.json"
  result = tensor_parallel_collectives.main([
      "--batch=2", "--seq_len=8", "--d_model=16", "--n_heads=4", "--d_ff=32",
      "--n_experts=4", "--expert_size=8", "--block_size=8", "--tensors=2", f"--out={out}"])
  assert json.loads(out.read_text())["rows"] == result["rows"]
  rows = {r["model"]: r for r in result["rows"]}
  activation = 2 * 8 * 16 * 4  # B x T x d float32
  for model in ("dense", "sigma_moe"):
    layer = rows[model]["layer"]
    # Megatron's forward: the attention output and the FF's down projection, one all-reduce
    # of the activations each; nothing gathered or scattered inside a layer.
    assert layer["all-reduce fwd n"] == 2 and layer["all-reduce fwd bytes"] == 2 * activation
    assert not any(k.startswith(("all-gather", "reduce-scatter")) for k in layer)
    assert layer["all-reduce bwd n"] >= 2
  # The sparse QKV attention has no output layer: its heads are gathered, once; the FF's
  # partial outputs all-reduced, once; the module convolutions exchange neighbours. (Two
  # modules per device: with one, XLA all-gathers the convolution kernels' Adam updates.)
  sparse = rows["sparse_ff_qkv"]["layer"]
  assert sparse["all-gather fwd n"] == 1 and sparse["all-gather fwd bytes"] == activation
  assert sparse["all-reduce fwd n"] == 1 and sparse["all-reduce fwd bytes"] == activation
  assert sparse["collective-permute fwd n"] > 0
  # SwitchHead: Megatron's forward too (the O experts' partial sums over each device's heads,
  # then the FF's), its experts never gathered.
  switchhead = rows["switchhead"]["layer"]
  assert switchhead["all-reduce fwd n"] == 2
  assert switchhead["all-reduce fwd bytes"] == 2 * activation
  # Sequence parallelism: Megatron's forward again, each all-reduce now a reduce-scatter into
  # sequence shards, the sublayers' inputs all-gathered (the XL memory's too), no all-reduce.
  # Backward, the dense layer reduce-scatters its three input gradients (memory, segment,
  # FF) and all-reduces only parameter gradients; the MoE all-reduces its input gradient
  # (the router reads the gathered sequence too), then keeps its shard.
  for model, input_rs in (("dense_sequence_parallel", 3), ("sigma_moe_sequence_parallel", 2)):
    layer = rows[model]["layer"]
    assert layer["reduce-scatter fwd n"] == 2
    assert layer["reduce-scatter fwd bytes"] == 2 * activation // 2
    assert layer["all-gather fwd n"] == 3 and layer["all-gather fwd bytes"] == 3 * activation
    assert "all-reduce fwd n" not in layer
    assert layer["reduce-scatter bwd n"] == input_rs
    assert layer["all-gather bwd n"] == 2
  assert rows["dense_sequence_parallel"]["layer"]["all-reduce bwd bytes"] < activation
  assert "sparse_ff_qkv" in capsys.readouterr().out
