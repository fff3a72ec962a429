"""Which models (decoder LMs, the RoBERTa encoder) may be split over `mesh.tensor` so far,
checked with the config.

Tensor parallelism (`sparse_jax.parallel`) splits attention heads, feed-forward hidden units
and the vocabulary. What is split and tested equal to one device so far (tests/training/
test_tensor_parallel.py for whole LMs, tests/layers/test_expert_parallel.py for every MoE
kind's layer, tests/models/test_tensor_decoding.py for decoding): every attention kind on its
XLA path (Transformer-XL and causal by head; Scaling Transformers' sparse QKV by module and
head, `layers.sparse_qkv_attention`; SwitchHead and its XL form by head, each device running
its heads' experts in a `shard_map`, `layers.expert_parallel.head_parallel`); the dense FF,
Scaling Transformers' sparse FF (by hidden unit, whole controller blocks per device,
`layers.sparse_ff`) and the MoE kinds (their experts' columns in a `shard_map` with one
`psum`, `layers.expert_parallel`: the XLA grouped-matmul impls and, in maps that do not check
varying axes, the Triton and megablox kernels, which run SwitchHead's experts too), with
`data`, `fsdp` and `expert` beside `tensor`; the fused XL attention (`attention_impl=pallas`)
on each device's rows and heads in a `shard_map` (`layers.xl_attention.fused_per_device`;
tests/training/test_tensor_parallel_kernels.py, and without a gathered weight in the step
compiled for two H100s, tests/aot/test_tensor_parallel_kernels_compile.py); MoEUT's shared
layers (`model.layer_groups`); scanned and rematerialised
layers; dense and tied output layers; decoding (`sparse_jax.generate(..., mesh=)`); the
RoBERTa encoder (`models.encoder`: its attention's flattened `heads` projections around the
decoder's XLA core `attend`, and the same FF registry), fine-tuned whole, its head, or with
the SPARTAN memory or the adapters, and so is a fine-tuned LM (`backbone.kind=lm_checkpoint`);
the top-k FF (by hidden unit, each token's top K chosen across the devices,
`layers.topk_ff`), PKM (its values by row, `layers.pkm`), the multiplicative
output (by module: whole vocabulary blocks per device), and the `model.memory` and
`model.adapters` plug-ins, whole on each device (`layers.spartan`, `layers.adapters`).
Everything else is refused here, naming the field, until it is split and tested: the cuDNN
attention core (a kernel XLA cannot split by head), the Mosaic GPU and tokamax expert kernels
(for the FF's experts and SwitchHead's; not tested split: no interpret mode here). A split
dimension must divide evenly: heads, `d_ff` (dense and top-k), `expert_size`, the
multiplicative output's modules `loss_sparsity` and the LM's vocabulary by `mesh.tensor` (the
encoder's embedding table, read by no output layer, stays whole where it does not divide:
roberta-base's 50265 rows); the sparse FF's blocks `d_ff / block_size` (a block's units stay
on one device, where its choice is made) and the sparse QKV layer's modules
`attention_sparsity` (S; with the heads, so module and head boundaries meet at each device's
edge). Sequence parallelism (`model.sequence_parallel`, `layers.sequence_parallel`) takes
every model split over `tensor` here, its layers gathering and scattering along the sequence
themselves; the segment and memory lengths must divide (`tasks.lm` checks those).
"""

from sparse_jax import validation
from sparse_jax.models.lm_config import LMConfig, ModelConfig

TENSOR_FF_KINDS = ("dense", "topk", "pkm", "sparse_ff", "sigma_moe", "switch", "noisy_topk",
                   "sbase", "softmax_moe")
SWITCHHEAD_KINDS = ("switchhead", "switchhead_xl")
# The grouped-matmul impls tested split over `tensor`, for the FF's experts and SwitchHead's:
# the XLA ones, and the Triton and megablox kernels ("auto" resolves to one of these).
TENSOR_FF_IMPLS = ("auto", "blocked", "ragged", "gather", "pallas", "megablox")


def _supported(condition: bool, field: str, tensor: int, allowed: str, got) -> None:
  validation.require(condition, field, f"{allowed} with mesh.tensor={tensor} (the rest is not "
                     "split over tensor yet; docs/scaling_out.md)", got)


def _divides(size: int, field: str, tensor: int) -> None:
  validation.require(size % tensor == 0, field,
                     f"divisible by mesh.tensor={tensor} (it is split over tensor)", size)


def check_tensor_parallel(model: ModelConfig, tensor: int) -> None:
  """Raises `ConfigError` naming the field unless the typed `model` section (a decoder LM's
  or the encoder's) can be split `tensor` ways (module docstring); nothing to check for
  `tensor` 1."""
  if tensor == 1:
    return
  _check_ff(model.ff, tensor)
  _divides(model.n_heads, "model.n_heads", tensor)
  if isinstance(model, LMConfig):  # The encoder's attention is always `attend` on XLA.
    _check_lm_attention_and_output(model, tensor)


def _check_ff(ff, tensor: int) -> None:
  """The FF slot's kind, impl and split widths (the LM's and the encoder's registry)."""
  _supported(ff.kind in TENSOR_FF_KINDS, "model.ff.kind", tensor,
             f"one of {TENSOR_FF_KINDS}", ff.kind)
  if ff.kind in ("dense", "topk"):
    _divides(ff.d_ff, "model.ff.d_ff", tensor)
  elif ff.kind == "sparse_ff":
    validation.require((ff.d_ff // ff.block_size) % tensor == 0, "model.ff.block_size",
                       f"a block size giving a number of blocks d_ff / block_size divisible "
                       f"by mesh.tensor={tensor} (whole blocks per device; d_ff={ff.d_ff})",
                       ff.block_size)
  elif ff.kind != "pkm":  # (PKM's values and heads stay whole where `tensor` does not divide.)
    _supported(ff.impl in TENSOR_FF_IMPLS, "model.ff.impl", tensor,
               f"one of {TENSOR_FF_IMPLS}", ff.impl)
    _divides(ff.expert_size, "model.ff.expert_size", tensor)


def _check_lm_attention_and_output(model: LMConfig, tensor: int) -> None:
  """The decoder LM's attention kinds, cores and sparse QKV modules; its output layer and
  vocabulary (split in the loss, which never gathers whole logits)."""
  if model.attention in SWITCHHEAD_KINDS:
    _supported(model.attention_impl in TENSOR_FF_IMPLS, "model.attention_impl", tensor,
               f"one of {TENSOR_FF_IMPLS} with SwitchHead attention", model.attention_impl)
  _supported(model.attention_core != "cudnn", "model.attention_core", tensor,
             "not 'cudnn'", model.attention_core)
  if model.loss_sparsity:  # The multiplicative output's modules: whole vocabulary blocks.
    _divides(model.loss_sparsity, "model.loss_sparsity", tensor)
  _divides(model.vocab_size, "model.vocab_size", tensor)
  if model.attention_sparsity is not None:
    _divides(model.attention_sparsity, "model.attention_sparsity", tensor)
