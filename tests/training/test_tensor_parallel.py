"""Tensor parallelism: whole LMs on meshes with a `tensor` axis equal one device (8 simulated
CPU devices): the losses, gradient norms and parameters of 3 training steps, and the full
gradients of the loss, for the dense and the sigma-MoE LM (Transformer-XL attention; the
dense one with causal attention too) and Scaling Transformers' LM (sparse FF and sparse QKV
attention), the SwitchHead LM (with the sigma-MoE FF; its XL form on `data=2,tensor=4`) and
MoEUT on `tensor=8`, `data=2,tensor=4` and `fsdp=2,expert=2,tensor=2` (the LMs without
experts: `fsdp=2,tensor=4`; the sigma-MoE LM also on `expert=4,tensor=2`), the sigma-MoE LM
with scanned, rematerialised layers and a tied output layer on `data=2,tensor=4`, the LMs
with PKM FFs on `data=2,tensor=4` (the dense paths also on `tensor=8`, the gathered read on
`fsdp=2,tensor=4`), with the top-k FF and with the multiplicative output on `tensor=8` and
`data=2,tensor=4`, with a SPARTAN memory and adapters on `data=2,tensor=4`, the RoBERTa
encoder fine-tuned whole and with the SPARTAN memory and either adapters on
`data=2,tensor=4` and `fsdp=2,tensor=4` (with SPARTAN also `fsdp=2,expert=2,tensor=2` and
`expert=4,tensor=2`), the sigma-MoE LM fine-tuned with SPARTAN on `data=2,tensor=4`; a
checkpoint saved on `tensor=4` resumes on `data=2,tensor=2` and on one device, the sigma-MoE
LM's and SPARTAN fine-tuning's; `tensor=4` across two processes (both read every row: the
batch is not split over `tensor`) trains as one process does.

Tolerances: a mesh changes only the order of f32 reductions (each device's partial sums over
its heads, hidden units or vocabulary slice, then all-reduces), so losses and gradient norms
agree to a few f32 ulps of the summed magnitudes (rtol 2e-5, as tests/training/
test_parallel_training.py). Gradients: rtol 1e-4 with an atol of 1e-5 of each array's largest
magnitude, for elements that are themselves sums cancelling to near zero. Parameters after
Adam steps: atol 1e-4, a twentieth of the learning rate (2e-3): Adam normalises each update
to about `lr`, so an element whose gradient is at reduction-noise level can move by a
visible fraction of `lr` differently; the gradient comparison catches what that hides. The
LMs train with Adam's epsilon at 1e-6 (not 1e-8) for that reason: the XL position
projection's rows for the last sinusoid channels, nearly constant over these distances, shift
all of a query's scores alike, so their gradient is 0 up to rounding, which Adam at 1e-8
would turn into a step of order `lr` in a direction the reduction order picks.
"""

import jax
import numpy as np
import pytest
from flax import nnx
from hf_testing import PAD, reference_copy
from training_testing import (first_steps, one_and_two_processes, patch_step, sigterm_at,
                              train_losses)

from sparse_jax import parallel
from sparse_jax.configs import glue
from sparse_jax.tasks import task_for, train_and_evaluate
from sparse_jax.training.placement import Placement

ONE = (1, 1, 1, 1)
# (data, fsdp, expert, tensor); the dense FF has no experts to split, so fsdp 2 x tensor 4.
MESHES = [(1, 1, 1, 8), (2, 1, 1, 4), (1, 2, 2, 2)]
DENSE_MESHES = MESHES[:2] + [(1, 2, 1, 4)]
# The sigma-MoE LM also on expert 4 x tensor 2: its 8 experts 2 per expert group, each
# expert's columns halved.
MOE_MESHES = MESHES + [(1, 1, 4, 2)]


@pytest.fixture
def tp_config(tiny_config):
  """The tiny sigma-MoE LM with 8 heads of 4, experts of 16 and batches of 8: every mesh of 8
  splits its heads, hidden units, vocabulary (256) and batch."""
  tiny_config.data.batch_size = 8
  tiny_config.eval.batch_size = 8
  tiny_config.train.adam_eps = 1e-6  # The module docstring says why.
  tiny_config.model.update(n_heads=8)
  tiny_config.model.ff.n_experts = 8
  return tiny_config


def dense(config, attention="xl"):
  config.model.ff = {"kind": "dense", "d_ff": 64, "dropout": 0.1}
  config.model.attention = attention
  if attention != "xl":
    config.model.mem_len = 0
  return config


def sequence_parallel(config):
  """Sequence parallelism on the tensor meshes (`layers.sequence_parallel`): the residual
  stream, LayerNorms, dropout and the XL memory split along the sequence (16 positions, 16
  of memory: whole shards on every mesh)."""
  config.model.sequence_parallel = True
  return config


def sparse(config):
  """Scaling Transformers' sparse FF (16 blocks of 4) and sparse QKV attention (8 modules of
  4, one per head): every mesh of 8 splits whole blocks and modules. No dropout, so that the
  gradients compare in training mode."""
  config.model.ff = {"kind": "sparse_ff", "d_ff": 64, "block_size": 4}
  config.model.update(attention="sparse_qkv", mem_len=0, dropout=0.0)
  return config


# PKM FFs (8 sub-keys per half: 64 values, 4 heads): the authors' dense path (knn 8 covers
# the sub-keys) with either activation; Lample's top-knn (knn 2), read densely (the table is
# small) or gathered (16 sub-keys: 256 values, more than 16 per value read).
PKM_FFS = {"relu": {}, "softmax": {"activation": "softmax"},
           "top_knn": {"knn": 2, "dense_when_knn_covers": False},
           "top_knn_gathered": {"n_subkeys": 16, "knn": 2, "dense_when_knn_covers": False}}


def pkm(config, variant):
  config.model.ff = {"kind": "pkm", "n_subkeys": 8, "knn": 8, "n_heads": 4,
                     **PKM_FFS[variant]}
  return config


def topk(config):
  """The top-k FF keeping 8 of 64 hidden units (dropout after the top-K, as the authors')."""
  config.model.ff = {"kind": "topk", "d_ff": 64, "k": 8, "dropout": 0.1, "after_dropout": True}
  return config


def switchhead(config, attention="switchhead"):
  """SwitchHead attention (8 heads of 4 channels, 4 V and O experts each, 2 active) beside
  the sigma-MoE FF: every mesh of 8 splits whole heads with their experts."""
  config.model.update(attention=attention, attention_experts=4, attention_k=2)
  if attention != "switchhead_xl":
    config.model.mem_len = 0
  return config


def moeut(config):
  """MoEUT (Csordas et al. 2024): one shared SwitchHead + sigma-MoE block run as both layers
  (`layer_groups=1`), peri-LayerNorm, its routers' regularisers across the repeats."""
  config.model.update(layer_groups=1, block_norm="peri", moeut_ff_reg=0.01,
                      moeut_attention_reg=0.001)
  return switchhead(config)


def roberta_rte(tmp_path, method="full", backbone=None):
  """Fine-tuning the tiny RoBERTa (4 heads, d_ff 48, vocabulary 320; or the `lm_checkpoint`
  workdir `backbone`) on GLUE RTE with `method` (default `full`: every weight trains, so all
  of it is compared), batches of 8 sequences of 24 tokens: `data=2,tensor=4` splits its
  heads, hidden units, vocabulary and batch. The LMs' learning rate (2e-3, not the methods'
  2e-5 to 1e-3), so that the parameters' atol is a twentieth of it."""
  config = glue.get_config(f"rte,{method}")
  if backbone is None:
    config.backbone.path = reference_copy("roberta_320", tmp_path / "roberta")
  else:
    config.backbone.update(kind="lm_checkpoint", path=backbone)
  config.task.update(data_dir=str(tmp_path / "tfds"), max_len=24)
  config.train.update(steps=3, warmup_steps=1, batch_size=8, lr=2e-3, log_every=1,
                      eval_every=100, ckpt_every=100)
  config.eval.batch_size = 8
  return config


def classification_batch(vocab_size=320, pad=PAD):
  """8 random sequences of the tiny RoBERTa's vocabulary: `<s>`, 3 to 24 real tokens, then
  padding; random binary labels. Of bytes (`vocab_size` 256, `pad` 0), without `<s>`."""
  rng = np.random.default_rng(0)
  lengths = rng.integers(3, 25, 8).astype(np.int32)
  tokens = rng.integers(3, vocab_size, (8, 24)).astype(np.int32)
  if pad == PAD:
    tokens[:, 0] = 0
  tokens[np.arange(24)[None, :] >= lengths[:, None]] = pad
  return {"tokens": tokens, "lengths": lengths,
          "labels": rng.integers(0, 2, 8).astype(np.int32)}


def loss_and_grads(config, shape, batch, train=False):
  """The loss on the host arrays `batch` and its gradients w.r.t. every parameter, for the
  model as built, on a mesh of `shape` (the model and batch placed as training places them);
  in evaluation mode (dropout off: only the mesh differs), or in training mode with `train`
  (for the sparse FF, whose controller has gradients only there; the config's dropout must
  then be 0)."""
  config.mesh = dict(zip(parallel.MESH_AXES, shape))
  task, mesh = task_for(config), parallel.make_mesh(shape)
  placement = Placement(mesh)
  with jax.set_mesh(mesh):
    model, _ = task.build(placement)
    carry = task.init_carry(model, placement)
    batch = placement.global_batch(batch, len(next(iter(batch.values()))))

    @nnx.jit
    def grads(model, batch, carry):
      if train:
        model.train()
      else:
        model.eval()
      (loss, _), g = nnx.value_and_grad(task.loss, has_aux=True)(model, batch, carry)
      return loss, g

    loss, g = grads(model, batch, carry)
  return float(loss), jax.device_get(nnx.to_pure_dict(g))


def assert_grads_close(got, want, mesh, zero=None):
  """Module docstring's tolerances. Arrays whose path contains `zero` have gradients that are
  0 in exact arithmetic (a key bias: softmax ignores a shift common to a query's scores; a
  parameter the loss does not read), so on every mesh they are rounding noise of cancelling
  sums: each is checked to be below 1e-7 of the largest gradient instead."""
  largest = max(float(np.abs(w).max()) for w in jax.tree.leaves(want))

  def close(path, g, w):
    where = f"{mesh} {jax.tree_util.keystr(path)}"
    if zero is not None and zero in where:
      assert max(np.abs(g).max(), np.abs(w).max()) < 1e-7 * largest, where
      return
    atol = 1e-5 * max(float(np.abs(w).max(initial=0.0)), 1e-6)
    np.testing.assert_allclose(g, w, rtol=1e-4, atol=atol, err_msg=where)

  jax.tree.map_with_path(close, got, want)


def lm_batch():
  """8 random rows of 16 tokens and their next tokens."""
  tokens = np.random.default_rng(0).integers(0, 256, (8, 17), dtype=np.int32)
  return {"inputs": tokens[:, :-1], "targets": tokens[:, 1:]}


def assert_like_one_device(config, tmp_path, meshes, train=False, batch=None, zero=None):
  """`batch` (host arrays; default `lm_batch()`) is the one the gradients are compared on;
  the 3 steps read the task's own data. `zero`: as `assert_grads_close`'s."""
  batch = lm_batch() if batch is None else batch
  want_loss, want_grads = loss_and_grads(config, ONE, batch, train)
  assert all(np.abs(g).max() > 0 for path, g in jax.tree_util.tree_leaves_with_path(want_grads)
             if zero is None or zero not in jax.tree_util.keystr(path))
  ref_losses, ref_params, _ = first_steps(config, str(tmp_path / "one"), ONE, n_steps=3)
  for shape in meshes:
    loss, grads = loss_and_grads(config, shape, batch, train)
    np.testing.assert_allclose(loss, want_loss, rtol=2e-5, err_msg=str(shape))
    assert_grads_close(grads, want_grads, shape, zero)
    losses, params, run = first_steps(config, str(tmp_path / str(shape)), shape, n_steps=3)
    np.testing.assert_allclose(losses, ref_losses, rtol=2e-5, err_msg=str(shape))
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-4, err_msg=str(shape)),
                 params, ref_params)
    assert_split_over_tensor(run.model, shape[3])


def assert_split_over_tensor(model, tensor):
  """Heads, FF hidden units and the vocabulary are split `tensor` ways on the device: every
  parameter's first dimension named `heads`, `mlp` or `vocab` that `tensor` divides (as
  `parallel.RULES` choose; not the encoder's single token-type row) is split over `tensor`
  (and perhaps `fsdp` too), its shard at most `1 / tensor` of it."""
  params = nnx.state(model, nnx.Param)
  split = 0
  for path, param in jax.tree.leaves_with_path(params, is_leaf=lambda x: isinstance(
      x, nnx.Variable)):
    axes = parallel.declared_axes(param) or ()
    dims = [i for i, name in enumerate(axes)
            if name in ("heads", "mlp", "vocab") and param.shape[i] % tensor == 0]
    if dims:
      value, where = param[...], jax.tree_util.keystr(path)
      spec = tuple(value.sharding.spec) + (None,) * value.ndim
      mesh_axes = (spec[dims[0]],) if isinstance(spec[dims[0]], str) else spec[dims[0]] or ()
      assert parallel.TENSOR in mesh_axes, where
      shard = value.addressable_shards[0].data.shape[dims[0]]
      assert shard * tensor <= value.shape[dims[0]], where
      split += 1
  assert split >= 4  # Q or the module factors, the FF's up projection, embedding, output


def test_the_sigma_moe_lm_on_tensor_meshes_equals_one_device(tp_config, tmp_path):
  assert_like_one_device(tp_config, tmp_path, MOE_MESHES)


def test_the_dense_lm_on_tensor_meshes_equals_one_device(tp_config, tmp_path):
  assert_like_one_device(dense(tp_config), tmp_path, DENSE_MESHES)


def test_the_dense_causal_lm_on_a_tensor_mesh_equals_one_device(tp_config, tmp_path):
  assert_like_one_device(dense(tp_config, "causal"), tmp_path, MESHES[1:2])


def test_the_sequence_parallel_sigma_moe_lm_on_tensor_meshes_equals_one_device(tp_config,
                                                                               tmp_path):
  assert_like_one_device(sequence_parallel(tp_config), tmp_path,
                         DENSE_MESHES + MOE_MESHES[2:])


def test_the_sequence_parallel_dense_lm_on_tensor_meshes_equals_one_device(tp_config,
                                                                           tmp_path):
  assert_like_one_device(sequence_parallel(dense(tp_config)), tmp_path, DENSE_MESHES)


def test_the_sequence_parallel_causal_lm_on_a_tensor_mesh_equals_one_device(tp_config,
                                                                            tmp_path):
  assert_like_one_device(sequence_parallel(dense(tp_config, "causal")), tmp_path,
                         MESHES[:1])


def test_the_sequence_parallel_switchhead_lm_on_tensor_meshes_equals_one_device(tp_config,
                                                                                tmp_path):
  assert_like_one_device(sequence_parallel(switchhead(tp_config)), tmp_path, DENSE_MESHES)


def test_the_sequence_parallel_switchhead_xl_and_moeut_lms_on_a_tensor_mesh_equal_one_device(
    tp_config, tmp_path):
  """MoEUT's peri-LayerNorm: SwitchHead's values and the MoE's experts read the raw residual
  and their routers the normalised one, both gathered from the shards."""
  assert_like_one_device(sequence_parallel(switchhead(tp_config, "switchhead_xl")),
                         tmp_path / "xl", MESHES[1:2])
  assert_like_one_device(moeut(tp_config), tmp_path / "moeut", MESHES[:1])


def test_the_sequence_parallel_sparse_ff_and_sparse_qkv_lm_on_tensor_meshes_equals_one_device(
    tp_config, tmp_path):
  """The attention's heads go straight to sequence shards (an all-to-all), the sparse FF's
  partial sums are reduce-scattered; in training mode, as the test below."""
  assert_like_one_device(sequence_parallel(sparse(tp_config)), tmp_path, DENSE_MESHES,
                         train=True)


def test_the_sparse_ff_and_sparse_qkv_lm_on_tensor_meshes_equals_one_device(tp_config,
                                                                            tmp_path):
  """In training mode (the gradients too), the sparse FF draws its Gumbel noise and its
  hard/soft choice per call from the `routing` stream: the same values on every mesh (JAX's
  partitionable threefry)."""
  assert_like_one_device(sparse(tp_config), tmp_path, DENSE_MESHES, train=True)


@pytest.mark.parametrize("variant", PKM_FFS)
def test_the_pkm_lm_on_tensor_meshes_equals_one_device(tp_config, tmp_path, variant):
  """The values split by row (`layers.pkm`), the gathered read in a `shard_map`: the dense
  paths on `tensor=8` and `data=2,tensor=4`, Lample's top-knn on `data=2,tensor=4` (the
  gathered read also on `fsdp=2,tensor=4`, its table's columns gathered at the map's edge)."""
  meshes = {"top_knn": MESHES[1:2], "top_knn_gathered": DENSE_MESHES[1:]}.get(variant,
                                                                               MESHES[:2])
  assert_like_one_device(pkm(tp_config, variant), tmp_path, meshes)


def test_the_topk_ff_lm_on_tensor_meshes_equals_one_device(tp_config, tmp_path):
  """Each token's top 8 hidden units chosen across the devices that hold them
  (`layers.topk_ff.split_top_k_mask`); the steps train with the hidden dropout."""
  assert_like_one_device(topk(tp_config), tmp_path, MESHES[:2])


@pytest.mark.parametrize("ff", ["pkm_softmax", "pkm_top_knn_gathered", "topk"])
def test_the_sequence_parallel_pkm_and_topk_lms_on_a_tensor_mesh_equal_one_device(
    tp_config, tmp_path, ff):
  """PKM's dense read (softmax over the values split by row) and its gathered read, and the
  top-k FF (its choice across devices, hidden dropout), reading the gathered sequence and
  reduce-scattering their output."""
  config = topk(tp_config) if ff == "topk" else pkm(tp_config, ff.removeprefix("pkm_"))
  assert_like_one_device(sequence_parallel(config), tmp_path, DENSE_MESHES[1:2])


def test_the_switchhead_lm_on_tensor_meshes_equals_one_device(tp_config, tmp_path):
  assert_like_one_device(switchhead(tp_config), tmp_path, MESHES)


def test_the_switchhead_xl_lm_on_a_tensor_mesh_equals_one_device(tp_config, tmp_path):
  assert_like_one_device(switchhead(tp_config, "switchhead_xl"), tmp_path, MESHES[1:2])


def test_the_moeut_lm_on_tensor_meshes_equals_one_device(tp_config, tmp_path):
  assert_like_one_device(moeut(tp_config), tmp_path, MESHES)


@pytest.mark.usefixtures("offline_glue")
def test_the_roberta_encoder_fine_tuned_on_tensor_meshes_equals_one_device(tmp_path):
  """The encoder's attention (`BidirectionalSelfAttention`: flattened `heads` projections
  around the decoder's XLA core `attend`) and its dense FF split as the LM's do, and so does
  the classification head's hidden layer (`mlp`)."""
  assert_like_one_device(roberta_rte(tmp_path), tmp_path, DENSE_MESHES[1:],
                         batch=classification_batch(), zero="['key']['bias']")


@pytest.mark.usefixtures("offline_glue")
@pytest.mark.parametrize("method", ["spartan", "houlsby", "pfeiffer"])
def test_the_roberta_encoder_with_plug_ins_on_tensor_meshes_equals_one_device(tmp_path,
                                                                              method):
  """SPARTAN's memory (16 parents of 3 children, top 8) after every layer, or the adapters,
  over the frozen encoder split as above: the plug-ins stay whole on every device of `tensor`
  (`layers.spartan`, `layers.adapters` say why). Every gradient is compared, the frozen
  backbone's too. SPARTAN also on issue 74's meshes with `expert` (the encoder has no
  experts: `expert` splits the batch); its 4 heads do not split 8 ways."""
  meshes = DENSE_MESHES[1:] + (MOE_MESHES[2:] if method == "spartan" else [])
  assert_like_one_device(roberta_rte(tmp_path, method), tmp_path, meshes,
                         batch=classification_batch(), zero="['key']['bias']")


def test_the_lm_with_a_multiplicative_output_on_tensor_meshes_equals_one_device(tp_config,
                                                                                tmp_path):
  """Scaling Transformers' sparse loss layer (`model.loss_sparsity` 8: 8 modules of 32
  tokens, whole modules per device) with the dense FF."""
  tp_config.model.loss_sparsity = 8
  assert_like_one_device(dense(tp_config), tmp_path, MESHES[:2])


def test_the_lm_with_plug_ins_on_a_tensor_mesh_equals_one_device(tp_config, tmp_path):
  """The decoder LM with a SPARTAN memory (8 parents of 2 children, top 4) and Houlsby
  adapters (bottleneck 8) in every block, all of it trained: the plug-ins whole on each
  device of `tensor`, as in the encoder."""
  tp_config.model.memory = {"kind": "spartan", "n_parents": 8, "n_children": 2, "top_k": 4}
  tp_config.model.adapters = {"kind": "houlsby", "bottleneck": 8}
  assert_like_one_device(dense(tp_config), tmp_path, MESHES[1:2])


def test_the_sequence_parallel_lm_with_a_multiplicative_output_and_plug_ins_equals_one_device(
    tp_config, tmp_path):
  """Under sequence parallelism the plug-ins act on each device's positions (per token, their
  weights whole) and XLA's partitioner splits the multiplicative output from its input on
  sequence shards."""
  tp_config.model.update(loss_sparsity=8, sequence_parallel=True)
  tp_config.model.memory = {"kind": "spartan", "n_parents": 8, "n_children": 2, "top_k": 4}
  tp_config.model.adapters = {"kind": "houlsby", "bottleneck": 8}
  assert_like_one_device(dense(tp_config), tmp_path, MESHES[1:2])


def assert_resumes_across_tensor_sizes(config, tmp_path, monkeypatch):
  """A run stopped after step 2 on tensor 4 continues on `data=2,tensor=2` and on one device
  as the straight run on tensor 4 does: the checkpoint's arrays are restored into the new
  mesh's shardings."""
  config.train.update(steps=4, ckpt_every=2, log_every=1)
  four = parallel.make_mesh((1, 1, 1, 4))
  straight = str(tmp_path / "straight")
  train_and_evaluate(config, straight, mesh=four)
  expected = train_losses(straight)
  for name, shape in [("data2_tensor2", (2, 1, 1, 2)), ("one", ONE)]:
    workdir = str(tmp_path / name)
    with monkeypatch.context() as m:
      patch_step(m, sigterm_at(1))
      assert train_and_evaluate(config, workdir, mesh=four)["step"] == 2
    train_and_evaluate(config, workdir, mesh=parallel.make_mesh(shape))
    got = train_losses(workdir)
    assert sorted(got) == [1, 2, 3, 4]
    np.testing.assert_allclose([got[s] for s in range(1, 5)],
                               [expected[s] for s in range(1, 5)], rtol=2e-5, err_msg=name)


@pytest.mark.usefixtures("offline_glue")
def test_an_lm_backbone_fine_tuned_with_spartan_on_a_tensor_mesh_equals_one_device(
    tp_config, tmp_path):
  """`backbone.kind=lm_checkpoint`: the sigma-MoE LM above, pretrained 2 steps here, under a
  SPARTAN memory on `data=2,tensor=4` (its training-mode expert dropout in the 3 steps). The
  classifier reads no output layer of the LM (`w_out`, `b_out`: gradients 0)."""
  tp_config.train.update(steps=2, warmup_steps=1, ckpt_every=2, log_every=2)
  tp_config.data.data_dir = str(tmp_path / "tfds")
  train_and_evaluate(tp_config, str(tmp_path / "lm"))
  assert_like_one_device(roberta_rte(tmp_path, "spartan", backbone=str(tmp_path / "lm")),
                         tmp_path, MESHES[1:2], batch=classification_batch(256, pad=0),
                         zero="_out']")


@pytest.mark.parametrize("sequence", [False, True], ids=["", "sequence_parallel"])
def test_saved_on_tensor_4_resumes_on_data_2_tensor_2_and_on_one_device(tp_config, tmp_path,
                                                                          monkeypatch, sequence):
  """With sequence parallelism the XL memory in the checkpoint is split along its positions
  on `tensor=4`, and restored into the other meshes' shardings."""
  tp_config.data.data_dir = str(tmp_path / "tfds")
  tp_config.model.sequence_parallel = sequence
  assert_resumes_across_tensor_sizes(tp_config, tmp_path, monkeypatch)


@pytest.mark.usefixtures("offline_glue")
def test_fine_tuning_with_spartan_saved_on_tensor_4_resumes_on_other_meshes(tmp_path,
                                                                             monkeypatch):
  """The checkpoint holds the trainable part (memories, head, LayerNorms); the frozen
  encoder is rebuilt from its files on each mesh."""
  assert_resumes_across_tensor_sizes(roberta_rte(tmp_path, "spartan"), tmp_path, monkeypatch)


def test_the_scanned_rematerialised_tied_sigma_moe_lm_on_a_tensor_mesh_equals_one_device(
    tp_config, tmp_path):
  tp_config.model.update(scan_layers=True, remat="block", tie_embeddings=True)
  assert_like_one_device(tp_config, tmp_path, MESHES[1:2])


def test_tensor_across_two_processes_reads_every_row_on_both_and_trains_like_one(stdlib_slice,
                                                                                  tmp_path):
  """train.py on tensor 4 as two gloo-connected processes of 2 CPU devices each: each process
  holds half of every tensor group, so both read all the batch's rows (one data shard), and
  the run equals one process of 4 devices."""
  one_and_two_processes(stdlib_slice, tmp_path, [
      "--config.mesh.data=1", "--config.mesh.expert=1", "--config.mesh.tensor=4",
      "--config.model.n_heads=4"])
  multi, one = train_losses(tmp_path / "multi"), train_losses(tmp_path / "single")
  assert sorted(multi) == [1, 2, 3, 4]
  np.testing.assert_allclose([multi[s] for s in multi], [one[s] for s in multi], rtol=2e-5)
