"""The CPU, float64 emulation of the sigma-MoE authors' CVMM kernels, and the torch patches,
that the side-by-side harnesses share (`switchhead_reference/make_reference.py`,
`moeut_reference/make_reference.py`; RobertCsordas/switchhead and RobertCsordas/moeut ship
the same `cvmm.py`).

Their `cvmm.py` runs two Triton kernels under a hand-written `CVMM` autograd function:
`cvmm_triton_cpu` and `cvmm_triton_backward_cpu` compute what those kernels compute with torch
gathers/einsums (same index conventions: `sel_index`, `sel`, `out_index`, the -1 sentinel
meaning "write row sel_index"), so that their `CVMM`, and the gradients it saves, run on the
CPU in any dtype; `cvmm_autograd_cpu` is their `cvmm` as plain autograd, to check that
backward. `cpu_cvmm`, `float_keeps_float64` and `default_dtype` patch their modules and torch
for the duration of a run, without touching their files. The rest is what both scripts do
around the runs: their flags (`arg_parser`), importing their package from a checkout and
recording its commit and file hashes (`import_authors`), loading the drawn weights
(`load_params`), and comparing runs (`max_rel`, `assert_same_backward`).

Only the generation scripts import this module (run by hand, with torch installed): it is no
`test_*` file, and torch is imported inside the functions, so the test suite never imports
torch.
"""

import argparse
import contextlib
import hashlib
import importlib
import os
import subprocess
import sys
import types

import numpy as np


# --- CPU stand-ins for their Triton kernels ------------------------------------------------

def cvmm_triton_cpu(x, sel_index, sel, keys, out_dtype, out_index):
  """`cvmm_kernel`: for every sorted slot m, row `out_index[m]` (or `sel_index[m]` when
  out_index is the -1 sentinel) of the [M, N] result is `x[sel_index[m]] @ keys[sel[m]]`."""
  import torch  # pylint: disable=import-outside-toplevel
  x = x.flatten(end_dim=-2)
  sel_shape = sel.shape
  sel = sel.flatten()
  rows_out = sel_index if (out_index.numel() == 1 and out_index == -1) else out_index
  prod = torch.einsum("mk,mkn->mn", x[sel_index].to(out_dtype), keys[sel].to(out_dtype))
  out = torch.zeros((sel.shape[0], keys.shape[2]), dtype=out_dtype)
  out[rows_out] = prod
  return out.view(*sel_shape, keys.shape[2])


def cvmm_triton_backward_cpu(x, sel_index, sel, grads, n_experts, key_dtype, op_dtype,
                             out_index):
  """`cvmm_backward_kernel3`: `out[e] = sum_{m: sel[m] = e} x[sel_index[m]]^T
  grads[out_index[m]]` (out_index -1: `grads[sel_index[m]]`), `[n_experts, M, N]`."""
  import torch  # pylint: disable=import-outside-toplevel
  x = x.flatten(end_dim=-2)
  grads = grads.flatten(end_dim=-2)
  sel = sel.flatten()
  b_index = sel_index if (out_index.numel() == 1 and out_index == -1) else out_index
  outer = torch.einsum("im,in->imn", x[sel_index].to(op_dtype), grads[b_index].to(op_dtype))
  out = torch.zeros((n_experts, x.shape[1], grads.shape[1]), dtype=key_dtype)
  out.index_add_(0, sel.long(), outer.to(key_dtype))
  return out


def cvmm_autograd_cpu(x, sel, keys):
  """Their `cvmm(x, sel, keys)` (a `CVMMSel`, e.g. from `cvmm_prepare_sel2`) as plain
  autograd: sorted slot m reads row `sel_index[m]` of x and expert `sel[m]` and lands in row
  `out_index[m]` (None: row `sel_index[m]`); with a reduction weight the slots of a row are
  summed with it."""
  import torch  # pylint: disable=import-outside-toplevel
  x_rows = x.flatten(end_dim=-2)
  n_slots = sel.sel.numel()
  prod = torch.einsum("sk,skn->sn", x_rows[sel.sel_index], keys[sel.sel.flatten()])
  rows_out = sel.sel_index if sel.out_index is None else sel.out_index
  res = torch.zeros((n_slots, keys.shape[2]), dtype=prod.dtype).index_copy(
      0, rows_out.long(), prod)
  res = res.view(*sel.raw_sel.shape, keys.shape[2])
  if sel.reduction_weight is None:
    return res
  res = res.view(*sel.reduction_weight.shape, keys.shape[2])
  return (sel.reduction_weight.unsqueeze(-2).type_as(res) @ res).squeeze(-2)


# --- patches -------------------------------------------------------------------------------

@contextlib.contextmanager
def patched(obj, name, value):
  """`obj.name = value` for the duration of the block."""
  old = getattr(obj, name)
  setattr(obj, name, value)
  try:
    yield
  finally:
    setattr(obj, name, old)


@contextlib.contextmanager
def cpu_cvmm(cvmm_module, layer_module, dtype, autograd: bool):
  """Their cvmm on the CPU in `dtype`: emulated kernels under their `CVMM` function, or
  (`autograd`) their `cvmm`, as `layer_module` (the file of their layers) imported it,
  replaced by `cvmm_autograd_cpu`. `get_dtype()` (float32 outside autocast: the kernels'
  output dtype) returns `dtype`, their `torch.tensor(-1).cuda()` sentinels stay on the CPU,
  and `cvmm`'s check of the GPU generation (`torch.cuda.get_device_properties(0).major`, in
  moeut reached before the autocast test) sees a non-Volta device."""
  import torch  # pylint: disable=import-outside-toplevel
  with contextlib.ExitStack() as stack:
    stack.enter_context(patched(cvmm_module, "get_dtype", lambda: dtype))
    stack.enter_context(patched(cvmm_module, "cvmm_triton_call", cvmm_triton_cpu))
    stack.enter_context(patched(cvmm_module, "cvmm_triton_backward", cvmm_triton_backward_cpu))
    stack.enter_context(patched(torch.Tensor, "cuda", lambda self, *a, **k: self))
    stack.enter_context(patched(torch.cuda, "get_device_properties",
                                lambda *a, **k: types.SimpleNamespace(major=8)))
    if autograd:
      stack.enter_context(patched(layer_module, "cvmm", cvmm_autograd_cpu))
    yield


@contextlib.contextmanager
def float_keeps_float64():
  """`Tensor.float()` leaves float64 tensors as they are (their `get_sel` casts the router
  logits, `F.linear(t, w).float()`)."""
  import torch  # pylint: disable=import-outside-toplevel
  original = torch.Tensor.float

  def float_(self, *args, **kwargs):
    return self if self.dtype == torch.float64 else original(self, *args, **kwargs)

  with patched(torch.Tensor, "float", float_):
    yield


@contextlib.contextmanager
def default_dtype(dtype):
  """torch's default dtype set to `dtype` for the block (their scale buffers, `torch.full`,
  are created in it)."""
  import torch  # pylint: disable=import-outside-toplevel
  old_default = torch.get_default_dtype()
  torch.set_default_dtype(dtype)
  try:
    yield
  finally:
    torch.set_default_dtype(old_default)


# --- the runs ------------------------------------------------------------------------------

def authors_commit(src: str, given: str | None, repo_name: str) -> str:
  """`given`, or `git rev-parse HEAD` in `src` (a checkout of their `repo_name`)."""
  if given:
    return given
  try:
    return subprocess.run(["git", "-C", src, "rev-parse", "HEAD"], check=True,
                          capture_output=True, text=True).stdout.strip()
  except (OSError, subprocess.CalledProcessError):
    sys.exit("--authors_src is not a git work tree: pass --authors_commit (the commit it was "
             f"extracted from, e.g. `git --git-dir=<{repo_name}.git> rev-parse HEAD`)")


def arg_parser(description: str, package: str) -> argparse.ArgumentParser:
  """The flags both scripts take: `--authors_src` (a checkout of RobertCsordas/`package`) and
  `--authors_commit`; each script adds its outputs."""
  parser = argparse.ArgumentParser(description=description)
  parser.add_argument("--authors_src", required=True,
                      help=f"a checkout of RobertCsordas/{package} (holds {package}/)")
  parser.add_argument("--authors_commit", default=None,
                      help="its commit (default: `git rev-parse HEAD` in --authors_src)")
  return parser


def import_authors(authors_src: str, given_commit: str | None, package: str, layer_file: str):
  """Imports their `package` from the checkout `authors_src` (put first on sys.path), with its
  `cvmm` and `layer_file` submodules; returns `((package, cvmm, layer module), commit,
  {file name: sha256})` for `layer_file`.py and cvmm.py."""
  src = os.path.abspath(authors_src)
  sys.path.insert(0, src)
  pkg = importlib.import_module(package)
  cvmm_module = importlib.import_module(f"{package}.cvmm")
  layer_module = importlib.import_module(f"{package}.{layer_file}")
  assert os.path.dirname(os.path.abspath(pkg.__file__)) == os.path.join(src, package)
  commit = authors_commit(src, given_commit, package)
  sources = {}
  for name in (f"{layer_file}.py", "cvmm.py"):
    with open(os.path.join(src, package, name), "rb") as f:
      sources[name] = hashlib.sha256(f.read()).hexdigest()
  return (pkg, cvmm_module, layer_module), commit, sources


def load_params(module, params: dict, dtype) -> dict:
  """Copies `params` (numpy, by their `named_parameters()` names, all of them) into `module`
  in `dtype`; returns its named parameters."""
  import torch  # pylint: disable=import-outside-toplevel
  named = dict(module.named_parameters())
  assert set(named) == set(params), sorted(set(named) ^ set(params))
  with torch.no_grad():
    for name, value in params.items():
      named[name].copy_(torch.as_tensor(value, dtype=dtype))
  return named


def max_rel(a: np.ndarray, b: np.ndarray) -> float:
  return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-300))


def assert_same_backward(ref: dict, check: dict, prefix: str = "") -> None:
  """Their `CVMM` backward (`ref`) agrees with the pure autograd cvmm (`check`) to 1e-12."""
  for name, value in ref.items():
    err = max_rel(check[name], value)
    assert err < 1e-12, f"{prefix}{name}: their CVMM backward vs autograd, max rel {err:.2e}"
