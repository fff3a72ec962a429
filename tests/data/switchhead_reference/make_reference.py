"""Rebuilds `outputs.npz`: the authors' SwitchHead (RoPE) forward and gradients, float64.

  git --git-dir=<switchhead.git> archive HEAD | tar -x -C /tmp/switchhead_src
  python tests/data/switchhead_reference/make_reference.py --authors_src /tmp/switchhead_src \
      --authors_commit $(git --git-dir=<switchhead.git> rev-parse HEAD)

Needs torch (CPU is enough) and a checkout of RobertCsordas/switchhead (`switchhead/` under
`--authors_src`); `--authors_commit` may be left out when `--authors_src` is a git work tree.
Their code is imported from that path at generation time and never copied here: the test
(`tests/layers/test_switchhead_authors.py`) reads only the npz.

What runs is their `SwitchHeadRope` (`switchhead/switchhead.py`) at d_model 24, 2 heads,
head_dim 8, 4 experts, top-2, RoPE on the first half of each head (their default
`rotate_fraction = 0.5`, base 10000), dropout 0, expert dropout 0, on x [2, 7, 24] as
self-attention (`forward(x, x, x, mask=None)`: their default causal mask). The weights are
drawn here (numpy, fixed seed) at scales that keep routing and attention far from uniform;
the loss is `sum(out * R)` for a fixed random R.

Float64. Their code is not float64 as it stands, so the harness changes the following, each
only for the duration of the calls and without touching their files:
- cvmm (`switchhead/cvmm.py`): the two Triton kernels (`cvmm_triton_call`, the forward and
  input-gradient gather-matmul; `cvmm_triton_backward`, the per-expert weight gradient) are
  replaced by plain torch gathers/einsums that compute what the kernels compute (same index
  conventions: `sel_index`, `sel`, `out_index`); `get_dtype()` (float32 outside autocast: the
  kernels' output dtype) returns float64; their `torch.tensor(-1).cuda()` sentinels stay on
  the CPU. Their `CVMM` autograd function, with its hand-written backward, is kept: the
  gradients saved are theirs. A second run with a pure autograd cvmm (gather + einsum) checks
  that backward here (agreement asserted to 1e-12).
- `get_sel` casts the router logits to float32 (`F.linear(t, w).float()`, switchhead.py
  line 107); the harness makes `Tensor.float()` keep float64 tensors as they are while
  their forward runs. The scale buffer (`torch.full`, line 54) is created in float64 (torch's
  default dtype set to float64), and the RoPE `inv_freq` (float32 by construction,
  `torch.arange(...).float()`, line 188) is recomputed in float64 with their formula.
The same weights run through their code in plain float32 (Triton kernels emulated, nothing
else changed) to report how far float32 rounding moves their own result (printed only).
"""

import argparse
import contextlib
import hashlib
import math
import os
import subprocess
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "outputs.npz")

D_MODEL, N_HEADS, HEAD_DIM, N_EXPERTS, TOP_K = 24, 2, 8, 4, 2
BATCH, SEQ = 2, 7
ROTATE_FRACTION, ROPE_BASE = 0.5, 10000.0
SEED = 20240928
# Their parameter names (`named_parameters()`) and the std of the random weights: q and k
# give per-channel q, k of std 1.5 (scores of std ~2 after the 1/sqrt(Dh)), routers logits of
# std 2 (sigmoid scores spread over (0, 1)), v and o order-one outputs.
PARAM_STD = {"q.weight": 1.5 / math.sqrt(D_MODEL), "k.weight": 1.5 / math.sqrt(D_MODEL),
             "v": 1.0 / math.sqrt(D_MODEL), "o": 1.0 / math.sqrt(N_HEADS * HEAD_DIM),
             "sel_v": 2.0 / math.sqrt(D_MODEL), "sel_o": 2.0 / math.sqrt(D_MODEL)}
MIN_TOPK_MARGIN = 1e-3  # K-th minus (K+1)-th sigmoid score, every token, head and router


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
  out.index_add_(0, sel, outer.to(key_dtype))
  return out


def cvmm_autograd_cpu(x, sel, keys):
  """Their `cvmm(x, sel, keys)` (with `CVMMSel` from `cvmm_prepare_sel2`) as plain autograd:
  slot s (sorted order `out_index`) reads row `sel_index` of x and expert `sel`; with a
  reduction weight the slots of a row are summed with it."""
  import torch  # pylint: disable=import-outside-toplevel
  x_rows = x.flatten(end_dim=-2)
  n_slots = sel.sel.numel()
  prod = torch.einsum("sk,skn->sn", x_rows[sel.sel_index], keys[sel.sel.flatten()])
  res = torch.zeros((n_slots, keys.shape[2]), dtype=prod.dtype).index_copy(
      0, sel.out_index, prod)
  res = res.view(*sel.raw_sel.shape, keys.shape[2])
  if sel.reduction_weight is None:
    return res
  res = res.view(*sel.reduction_weight.shape, keys.shape[2])
  return (sel.reduction_weight.unsqueeze(-2).type_as(res) @ res).squeeze(-2)


@contextlib.contextmanager
def patched(obj, name, value):
  old = getattr(obj, name)
  setattr(obj, name, value)
  try:
    yield
  finally:
    setattr(obj, name, old)


@contextlib.contextmanager
def cpu_cvmm(cvmm_module, sh_module, dtype, autograd: bool):
  """Their cvmm on the CPU in `dtype`: emulated kernels under their `CVMM` function, or
  (`autograd`) their `cvmm` replaced by `cvmm_autograd_cpu`."""
  import torch  # pylint: disable=import-outside-toplevel
  with contextlib.ExitStack() as stack:
    stack.enter_context(patched(cvmm_module, "get_dtype", lambda: dtype))
    stack.enter_context(patched(cvmm_module, "cvmm_triton_call", cvmm_triton_cpu))
    stack.enter_context(patched(cvmm_module, "cvmm_triton_backward", cvmm_triton_backward_cpu))
    stack.enter_context(patched(torch.Tensor, "cuda", lambda self, *a, **k: self))
    if autograd:
      stack.enter_context(patched(sh_module, "cvmm", cvmm_autograd_cpu))
    yield


@contextlib.contextmanager
def float_keeps_float64():
  """`Tensor.float()` leaves float64 tensors as they are (their router logits, line 107)."""
  import torch  # pylint: disable=import-outside-toplevel
  original = torch.Tensor.float

  def float_(self, *args, **kwargs):
    return self if self.dtype == torch.float64 else original(self, *args, **kwargs)

  with patched(torch.Tensor, "float", float_):
    yield


# --- the run -------------------------------------------------------------------------------

def authors_commit(src: str, given: str | None) -> str:
  if given:
    return given
  try:
    return subprocess.run(["git", "-C", src, "rev-parse", "HEAD"], check=True,
                          capture_output=True, text=True).stdout.strip()
  except (OSError, subprocess.CalledProcessError):
    sys.exit("--authors_src is not a git work tree: pass --authors_commit (the commit it was "
             "extracted from, e.g. `git --git-dir=<switchhead.git> rev-parse HEAD`)")


def draw(rng: np.random.Generator, shapes: dict) -> dict:
  params = {name: rng.standard_normal(shape) * PARAM_STD[name] for name, shape in shapes.items()}
  x = rng.standard_normal((BATCH, SEQ, D_MODEL))
  r = rng.standard_normal((BATCH, SEQ, D_MODEL))
  return params, x, r


def topk_margin(w_ed: np.ndarray, x_btd: np.ndarray) -> float:
  scores = 1.0 / (1.0 + np.exp(-(x_btd @ w_ed.T)))
  scores = np.sort(scores.reshape(BATCH, SEQ, N_HEADS, N_EXPERTS), axis=-1)[..., ::-1]
  return float(np.min(scores[..., TOP_K - 1] - scores[..., TOP_K]))


def run(switchhead, cvmm_module, sh_module, params, x, r, dtype, *, exact64: bool,
        autograd_cvmm: bool = False):
  """Their forward and `d sum(out * r)` wrt x and every parameter, as float64 numpy."""
  import torch  # pylint: disable=import-outside-toplevel
  old_default = torch.get_default_dtype()
  torch.set_default_dtype(dtype)  # the scale buffer (torch.full) is created in it
  try:
    layer = switchhead.SwitchHeadRope(
        D_MODEL, N_HEADS, N_EXPERTS, dropout=0.0, d_head=HEAD_DIM, expert_dropout=0.0,
        moe_k=TOP_K, init_scale=1.0, rotate_fraction=ROTATE_FRACTION, rope_base=ROPE_BASE)
  finally:
    torch.set_default_dtype(old_default)
  layer = layer.to(dtype)
  if exact64:
    n = layer.n_rotate
    layer.pe.inv_freq = 1.0 / (ROPE_BASE ** (torch.arange(0, n, 2, dtype=dtype) / n))
  named = dict(layer.named_parameters())
  assert set(named) == set(params), sorted(named)
  with torch.no_grad():
    for name, value in params.items():
      named[name].copy_(torch.as_tensor(value, dtype=dtype))
  layer.eval()
  xt = torch.as_tensor(x, dtype=dtype).requires_grad_(True)
  rt = torch.as_tensor(r, dtype=dtype)
  with contextlib.ExitStack() as stack:
    stack.enter_context(cpu_cvmm(cvmm_module, sh_module, dtype, autograd_cvmm))
    if exact64:
      stack.enter_context(float_keeps_float64())
    out, _ = layer(xt, xt, xt, mask=None)
    assert out.dtype == dtype, out.dtype
    (out * rt).sum().backward()
  result = {"out": out.detach().numpy().astype(np.float64),
            "grad/x": xt.grad.numpy().astype(np.float64)}
  for name, p in named.items():
    result[f"grad/{name}"] = p.grad.numpy().astype(np.float64)
  return result


def max_rel(a: np.ndarray, b: np.ndarray) -> float:
  return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--authors_src", required=True,
                      help="a checkout of RobertCsordas/switchhead (holds switchhead/)")
  parser.add_argument("--authors_commit", default=None,
                      help="its commit (default: `git rev-parse HEAD` in --authors_src)")
  parser.add_argument("--out", default=OUT)
  args = parser.parse_args()

  import torch  # pylint: disable=import-outside-toplevel
  src = os.path.abspath(args.authors_src)
  sys.path.insert(0, src)
  import switchhead  # pylint: disable=import-outside-toplevel
  from switchhead import cvmm as cvmm_module  # pylint: disable=import-outside-toplevel
  from switchhead import switchhead as sh_module  # pylint: disable=import-outside-toplevel
  assert os.path.dirname(os.path.abspath(switchhead.__file__)) == os.path.join(src, "switchhead")
  commit = authors_commit(src, args.authors_commit)
  sources = {}
  for name in ("switchhead.py", "cvmm.py"):
    with open(os.path.join(src, "switchhead", name), "rb") as f:
      sources[name] = hashlib.sha256(f.read()).hexdigest()

  shapes = {"q.weight": (N_HEADS * HEAD_DIM, D_MODEL), "k.weight": (N_HEADS * HEAD_DIM, D_MODEL),
            "v": (N_HEADS * N_EXPERTS, D_MODEL, HEAD_DIM),
            "o": (N_HEADS * N_EXPERTS, HEAD_DIM, D_MODEL),
            "sel_v": (N_HEADS * N_EXPERTS, D_MODEL), "sel_o": (N_HEADS * N_EXPERTS, D_MODEL)}
  params, x, r = draw(np.random.default_rng(SEED), shapes)
  margin = min(topk_margin(params["sel_v"], x), topk_margin(params["sel_o"], x))
  assert margin > MIN_TOPK_MARGIN, f"near-tie in a top-{TOP_K} ({margin:.2e}): change SEED"

  common = (switchhead, cvmm_module, sh_module, params, x, r)
  ref = run(*common, torch.float64, exact64=True)
  check = run(*common, torch.float64, exact64=True, autograd_cvmm=True)
  as_is32 = run(*common, torch.float32, exact64=False)
  for name, value in ref.items():
    err = max_rel(check[name], value)
    assert err < 1e-12, f"{name}: their CVMM backward vs autograd, max rel {err:.2e}"
  print(f"top-{TOP_K} margin {margin:.3e}")
  print(f"{'array':>16} {'max|ref|':>10} {'autograd cvmm':>14} {'their float32':>14}  (max rel)")
  for name, value in ref.items():
    print(f"{name:>16} {np.max(np.abs(value)):10.3e} {max_rel(check[name], value):14.2e} "
          f"{max_rel(as_is32[name], value):14.2e}")

  arrays = {f"param/{name}": value for name, value in params.items()}
  arrays.update(ref)
  arrays.update(
      x=x, r=r,
      shape=np.array([D_MODEL, N_HEADS, HEAD_DIM, N_EXPERTS, TOP_K, BATCH, SEQ]),
      rotate_fraction=np.float64(ROTATE_FRACTION), rope_base=np.float64(ROPE_BASE),
      authors_repo=np.str_("https://github.com/RobertCsordas/switchhead"),
      authors_commit=np.str_(commit),
      authors_sha256=np.str_(" ".join(f"{k}:{v}" for k, v in sources.items())),
      torch_version=np.str_(torch.__version__), dtype=np.str_("float64"),
      max_rel_their_float32=np.array([max_rel(as_is32[k], v) for k, v in ref.items()]),
      max_rel_their_float32_names=np.array(list(ref)))
  np.savez_compressed(args.out, **arrays)
  print(f"wrote {args.out} ({os.path.getsize(args.out)} bytes), their commit {commit}, "
        f"torch {torch.__version__}")


if __name__ == "__main__":
  main()
