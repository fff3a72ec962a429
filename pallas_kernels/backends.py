"""The implementations behind `cvmm` and `expert_mlp`, and how `impl` picks one.

Every impl but the gather oracle is a *backend*: how the token slots are laid out as rows
grouped by expert (`make_layout`), how those rows are multiplied by their expert's weights
(`matmul`, also on the transposed weights for input gradients), and how the per-expert
weight gradient is formed (`weight_grad`). The ops (`cvmm`, `expert_mlp`) own the custom VJPs
and call these three.

The row operands of `matmul` and `weight_grad` are the layout's rows. The ops ask the backend
for them (`token_rows`, `slot_rows`): a backend that `gathers_rows` (the Pallas Triton kernels)
gets a `slot_layout.IndexedRows`, the source array and the index of each row, and gathers in
its kernels' row loads, so no [N*k, M] copy of a token-shared input is made; every other
backend gets that copy, gathered by XLA as before.
"""

import dataclasses
import functools
from typing import Callable

import jax
import jax.numpy as jnp

from pallas_kernels import blocked
from pallas_kernels import megablox
from pallas_kernels import mosaic_matmul
from pallas_kernels import mosaic_weight_grad
from pallas_kernels import ragged
from pallas_kernels import slot_layout
from pallas_kernels import triton_matmul
from pallas_kernels import triton_weight_grad

IMPLS = ("auto", "pallas", "mosaic", "megablox", "blocked", "ragged", "tokamax", "gather")


@dataclasses.dataclass(frozen=True)
class Backend:
  """One grouped-matmul implementation (see the module docstring).

  gathers_rows: whether `matmul` and `weight_grad` take `slot_layout.IndexedRows` for their
  row operands (rows loaded through the index inside the kernels); otherwise they get arrays.
  """
  make_layout: Callable[..., slot_layout.SlotLayout]
  matmul: Callable[..., jax.Array]
  weight_grad: Callable[..., jax.Array]
  gathers_rows: bool = False

  def token_rows(self, values_n: jax.Array, layout: slot_layout.SlotLayout, k: int,
                 scale_r: jax.Array | None = None):
    """The layout's rows of a token-shared input [N, D] (row r: token row_slot[r] // k, times
    scale_r[r] if given), in the form this backend's `matmul` and `weight_grad` take."""
    rows = slot_layout.IndexedRows(values_n, slot_layout.token_rows_index(layout, k), scale_r)
    return rows if self.gathers_rows else slot_layout.materialize(rows)

  def slot_rows(self, values_s: jax.Array, layout: slot_layout.SlotLayout):
    """The layout's rows of a per-slot input [S, D] (row r: slot row_slot[r]), likewise."""
    rows = slot_layout.IndexedRows(values_s, layout.row_slot_r)
    return rows if self.gathers_rows else slot_layout.materialize(rows)


def _triton_matmul(layout, x_rm, w_eml, *, transpose, out_dtype, interpret):
  """Forward kernel; on w^T (materialised, E*M*L elements) for the input gradient. Rows given
  as `IndexedRows` are gathered in the kernel's loads."""
  w_emx = jnp.swapaxes(w_eml, 1, 2) if transpose else w_eml
  return triton_matmul.segment_matmul(x_rm, w_emx, layout.groups, out_dtype=out_dtype,
                                      interpret=interpret)


def _triton_weight_grad(layout, x_rm, dy_rl, *, num_experts, out_dtype, interpret):
  del num_experts  # The groups table has one entry per expert.
  return triton_weight_grad.weight_grad(x_rm, dy_rl, layout.groups, out_dtype=out_dtype,
                                        interpret=interpret)


def _triton_backend(interpret: bool) -> Backend:
  return Backend(slot_layout.sorted_layout,
                 functools.partial(_triton_matmul, interpret=interpret),
                 functools.partial(_triton_weight_grad, interpret=interpret),
                 gathers_rows=True)


def _mosaic_matmul(layout, x_rm, w_eml, *, transpose, out_dtype):
  """Forward kernel; reads w [E, M, L] transposed in shared memory for the input gradient."""
  return mosaic_matmul.segment_matmul(x_rm, w_eml, layout.groups, transpose_w=transpose,
                                      out_dtype=out_dtype)


def _mosaic_weight_grad(layout, x_rm, dy_rl, *, num_experts, out_dtype):
  del num_experts  # The groups table has one entry per expert.
  return mosaic_weight_grad.weight_grad(x_rm, dy_rl, layout.groups, out_dtype=out_dtype)


def _megablox_backend(interpret: bool) -> Backend:
  return Backend(slot_layout.sorted_layout,
                 functools.partial(megablox.matmul, interpret=interpret),
                 functools.partial(megablox.weight_grad, interpret=interpret))


def _ragged_backend(library) -> Backend:
  return Backend(slot_layout.sorted_layout,
                 functools.partial(ragged.matmul, library=library),
                 functools.partial(ragged.weight_grad, library=library))


_BACKENDS = {
    "pallas_triton": _triton_backend(interpret=False),
    "pallas_interpret": _triton_backend(interpret=True),
    "mosaic": Backend(slot_layout.sorted_layout, _mosaic_matmul, _mosaic_weight_grad),
    "megablox_tpu": _megablox_backend(interpret=False),
    "megablox_interpret": _megablox_backend(interpret=True),
    "blocked": Backend(blocked.make_layout, blocked.matmul, blocked.weight_grad),
    "ragged": _ragged_backend(jax.lax),
}


def backend(impl: str) -> Backend:
  """The backend of a resolved impl (tokamax is imported here, only when asked for)."""
  if impl == "pallas":
    return _BACKENDS["pallas_triton" if targets_gpu() else "pallas_interpret"]
  if impl == "megablox":
    return _BACKENDS["megablox_tpu" if target_platform() == "tpu" else "megablox_interpret"]
  if impl == "tokamax":
    return _ragged_backend(ragged.import_tokamax())
  return _BACKENDS[impl]


def target_platform() -> str:
  """The platform traced for: that of the mesh in scope when its devices say (an abstract
  GPU or TPU mesh: how kernels are compiled for devices this machine does not have), else
  the default backend's."""
  mesh = jax.sharding.get_abstract_mesh()
  device = None if mesh.empty else mesh.abstract_device
  return getattr(device, "platform", None) or jax.default_backend()


def targets_gpu() -> bool:
  """True when tracing for a GPU (`target_platform`)."""
  return target_platform() == "gpu"


def partitionable(impl: str) -> bool:
  """False when the resolved `impl` runs a Pallas kernel compiled for a GPU or TPU: XLA
  cannot split such a custom call over a mesh (Mosaic TPU refuses; GPU kernels would run
  on whole, gathered arrays), so callers on a multi-device mesh map it over their shards."""
  return not (impl in ("pallas", "mosaic", "megablox") and target_platform() in ("gpu", "tpu"))


def check_impl(impl: str) -> None:
  """Raise a ValueError unless `impl` is one of IMPLS."""
  if impl not in IMPLS:
    raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")


def resolve(impl: str, dtype, *weight_shapes: tuple[int, ...]) -> str:
  """The impl to run for weights [E, M, L] of `weight_shapes`: auto becomes the Pallas
  Triton kernels when tracing for a GPU, megablox on a TPU and the blocked XLA path
  elsewhere; mosaic is checked for a GPU, a 16-bit dtype and M, L multiples of 64 (a
  ValueError saying what to use instead)."""
  if impl == "auto":
    if targets_gpu():
      return "pallas"
    return "megablox" if target_platform() == "tpu" else "blocked"
  if impl == "mosaic":
    if not targets_gpu():
      raise ValueError("impl='mosaic' runs on NVIDIA Hopper GPUs only (wgmma and TMA have no "
                       "interpret mode): use impl='pallas' or 'blocked' here")
    for _, size_m, size_l in weight_shapes:
      mosaic_matmul.check_problem(dtype, M=size_m, L=size_l)
  return impl
