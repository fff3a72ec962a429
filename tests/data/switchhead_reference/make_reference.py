"""Rebuilds `outputs.npz` and `outputs_xl.npz`: the authors' SwitchHead (RoPE, XL), float64.

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

`outputs_xl.npz` (`tests/layers/test_switchhead_authors.py` again): their `SwitchHeadXL`
(same file, Transformer-XL relative positions) at the same sizes, 3 memory rows and a 4-row
segment, on a context ctx [2, 3 + 4, 24] whose first 3 rows are the memory (all real: our
`mem_valid = 3`), every weight drawn as above (own seed), the loss `sum(out * R)` over the
segment's outputs, gradients wrt ctx and every weight (their `pos_to_pk` included). Their
`forward(q_src, k_src, v_src, mask, kv_cache)` cannot take the memory as `k_src`: it sets
`pos_offset = q_src.shape[1] - k_src.shape[1]` and asserts it is >= 0 (switchhead.py lines
131-132), so K = k_src longer than Q fails. It takes it through `kv_cache` (lines 156-162):
the harness runs their layer on the memory rows (`kv_cache={}`: their K, and V through the V
router and experts, of the memory rows) and then on the segment with that cache, their
default mask (causal over the segment, memory visible: `get_mask_tensor` pads it, lines
90-95). With a cache `pos_offset` is 0 (q_src and k_src both the segment), which puts query i
of the segment at position i instead of M + i in `get_pos_subset` (lines 327-332): the
harness passes `attend` `pos_offset + K_len - Q_len` = M instead, the value the paper's code
passes (RobertCsordas/moe_attention `models/transformer_language_model.py` line 114,
`pos_offset` = the memory length, with `attend_to` = [memory; segment]). Their output with
the offset as released is saved too (`out_as_released`, float64), to show the difference.
Float64 as above, plus: their sinusoid table (`pos_encoding`, built in float32 by
`sinusoidal_pos_embedding`, lines 314-320) is recomputed in float64 with their formula.
"""

import contextlib
import math
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
# Run as a script: the emulation of their CVMM kernels and the torch patches it shares with
# moeut_reference/make_reference.py are in tests/data/authors_torch.py, one folder up.
sys.path.insert(0, os.path.dirname(HERE))
# pylint: disable=wrong-import-position
from authors_torch import (arg_parser, assert_same_backward, cpu_cvmm, default_dtype,
                           float_keeps_float64, import_authors, load_params, max_rel, patched)
# pylint: enable=wrong-import-position

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
# XL: memory rows, segment rows, its seed; `pos_to_pk` [H*Dh, d] like q and k (position scores
# of the size of the content scores).
OUT_XL = os.path.join(HERE, "outputs_xl.npz")
MEM, SEG = 3, 4
SEED_XL = 20240929
PARAM_STD_XL = dict(PARAM_STD, pos_to_pk=1.5 / math.sqrt(D_MODEL))


# --- the run -------------------------------------------------------------------------------

def draw(rng: np.random.Generator, shapes: dict, std: dict = PARAM_STD,
         x_len: int = SEQ, r_len: int = SEQ) -> dict:
  params = {name: rng.standard_normal(shape) * std[name] for name, shape in shapes.items()}
  x = rng.standard_normal((BATCH, x_len, D_MODEL))
  r = rng.standard_normal((BATCH, r_len, D_MODEL))
  return params, x, r


def topk_margin(w_ed: np.ndarray, x_btd: np.ndarray) -> float:
  scores = 1.0 / (1.0 + np.exp(-(x_btd @ w_ed.T)))
  scores = np.sort(scores.reshape(*x_btd.shape[:-1], N_HEADS, N_EXPERTS), axis=-1)[..., ::-1]
  return float(np.min(scores[..., TOP_K - 1] - scores[..., TOP_K]))


def out_and_grads(out, x_t, named: dict) -> dict:
  """`out` and the gradients (after backward) wrt the input `x_t` and every parameter, as
  float64 numpy."""
  result = {"out": out.detach().numpy().astype(np.float64),
            "grad/x": x_t.grad.numpy().astype(np.float64)}
  for name, p in named.items():
    result[f"grad/{name}"] = p.grad.numpy().astype(np.float64)
  return result


def run(switchhead, cvmm_module, sh_module, params, x, r, dtype, *, exact64: bool,
        autograd_cvmm: bool = False):
  """Their forward and `d sum(out * r)` wrt x and every parameter, as float64 numpy."""
  import torch  # pylint: disable=import-outside-toplevel
  with default_dtype(dtype):  # the scale buffer (torch.full) is created in it
    layer = switchhead.SwitchHeadRope(
        D_MODEL, N_HEADS, N_EXPERTS, dropout=0.0, d_head=HEAD_DIM, expert_dropout=0.0,
        moe_k=TOP_K, init_scale=1.0, rotate_fraction=ROTATE_FRACTION, rope_base=ROPE_BASE)
  layer = layer.to(dtype)
  if exact64:
    n = layer.n_rotate
    layer.pe.inv_freq = 1.0 / (ROPE_BASE ** (torch.arange(0, n, 2, dtype=dtype) / n))
  named = load_params(layer, params, dtype)
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
  return out_and_grads(out, xt, named)


def sinusoid_table_float64(pe_size: int, n_rows: int):
  """Their `create_pos_buffer` (`sinusoidal_pos_embedding`: positions `-(n+1)/2 + 1 ...`, sin
  at even and cos at odd channels, `exp(2i * -ln(10000) / d)` frequencies) in float64."""
  import torch  # pylint: disable=import-outside-toplevel
  max_len = (n_rows + 1) // 2
  position = torch.arange(0, n_rows, dtype=torch.float64).unsqueeze(1) - max_len + 1
  div_term = torch.exp(torch.arange(0, pe_size, 2, dtype=torch.float64) *
                       (-math.log(10000.0) / pe_size))
  pe = torch.zeros(n_rows, pe_size, dtype=torch.float64)
  pe[:, 0::2] = torch.sin(position * div_term)
  pe[:, 1::2] = torch.cos(position * div_term)
  return pe


def run_xl(switchhead, cvmm_module, sh_module, params, ctx, r, dtype, *, exact64: bool,
           autograd_cvmm: bool = False, as_released: bool = False):
  """Their SwitchHeadXL on the segment `ctx[:, MEM:]` with the memory `ctx[:, :MEM]` in the
  KV cache (module docstring), `pos_offset` corrected to MEM unless `as_released`: output and
  `d sum(out * r)` wrt ctx and every parameter, float64 numpy."""
  import torch  # pylint: disable=import-outside-toplevel
  with default_dtype(dtype):
    layer = switchhead.SwitchHeadXL(D_MODEL, N_HEADS, N_EXPERTS, dropout=0.0, d_head=HEAD_DIM,
                                    expert_dropout=0.0, moe_k=TOP_K, init_scale=1.0)
  layer = layer.to(dtype)
  if exact64:
    table = sinusoid_table_float64(layer.pe_size, layer.pos_encoding.shape[0])
    assert float((table - layer.pos_encoding).abs().max()) < 1e-3  # float32 angles up to 999
    layer.pos_encoding = table
  named = load_params(layer, params, dtype)
  layer.eval()
  original_attend = layer.attend
  offsets = []

  def attend_at_memory_offset(pos_offset, v, k, q, mask):
    assert pos_offset == 0  # their forward's q_src.shape[1] - k_src.shape[1], cache excluded
    offsets.append(k.shape[-2] - q.shape[-2])
    return original_attend(0 if as_released else offsets[-1], v, k, q, mask)

  ctx_t = torch.as_tensor(ctx, dtype=dtype).requires_grad_(True)
  rt = torch.as_tensor(r, dtype=dtype)
  mem, seg = ctx_t[:, :MEM], ctx_t[:, MEM:]
  with contextlib.ExitStack() as stack:
    stack.enter_context(cpu_cvmm(cvmm_module, sh_module, dtype, autograd_cvmm))
    stack.enter_context(patched(layer, "attend", attend_at_memory_offset))
    if exact64:
      stack.enter_context(float_keeps_float64())
    _, cache = layer(mem, mem, mem, mask=None, kv_cache={})
    assert cache["k"].shape[-2] == MEM and cache["v"].shape[-2] == MEM
    out, _ = layer(seg, seg, seg, mask=None, kv_cache=cache)
    assert out.dtype == dtype and out.shape == (BATCH, SEG, D_MODEL), (out.dtype, out.shape)
    (out * rt).sum().backward()
  assert offsets == [0, MEM], offsets
  return out_and_grads(out, ctx_t, named)


def save(path, params, ref, as_is32, commit, sources, torch_version, **specifics) -> None:
  """The npz: the weights, their float64 outputs and gradients (`ref`), the run's own arrays
  (`specifics`, in that order), where their code came from, and how far their float32 run is
  from `ref`."""
  arrays = {f"param/{name}": value for name, value in params.items()}
  arrays.update(ref)
  arrays.update(specifics)
  arrays.update(
      authors_repo=np.str_("https://github.com/RobertCsordas/switchhead"),
      authors_commit=np.str_(commit),
      authors_sha256=np.str_(" ".join(f"{k}:{v}" for k, v in sources.items())),
      torch_version=np.str_(torch_version), dtype=np.str_("float64"),
      max_rel_their_float32=np.array([max_rel(as_is32[k], v) for k, v in ref.items()]),
      max_rel_their_float32_names=np.array(list(ref)))
  np.savez_compressed(path, **arrays)
  print(f"wrote {path} ({os.path.getsize(path)} bytes), their commit {commit}, "
        f"torch {torch_version}")


def make_rope(path, modules, commit, sources, torch_version) -> None:
  import torch  # pylint: disable=import-outside-toplevel
  shapes = {"q.weight": (N_HEADS * HEAD_DIM, D_MODEL), "k.weight": (N_HEADS * HEAD_DIM, D_MODEL),
            "v": (N_HEADS * N_EXPERTS, D_MODEL, HEAD_DIM),
            "o": (N_HEADS * N_EXPERTS, HEAD_DIM, D_MODEL),
            "sel_v": (N_HEADS * N_EXPERTS, D_MODEL), "sel_o": (N_HEADS * N_EXPERTS, D_MODEL)}
  params, x, r = draw(np.random.default_rng(SEED), shapes)
  margin = min(topk_margin(params["sel_v"], x), topk_margin(params["sel_o"], x))
  assert margin > MIN_TOPK_MARGIN, f"near-tie in a top-{TOP_K} ({margin:.2e}): change SEED"

  common = (*modules, params, x, r)
  ref = run(*common, torch.float64, exact64=True)
  check = run(*common, torch.float64, exact64=True, autograd_cvmm=True)
  as_is32 = run(*common, torch.float32, exact64=False)
  assert_same_backward(ref, check)
  print(f"top-{TOP_K} margin {margin:.3e}")
  print(f"{'array':>16} {'max|ref|':>10} {'autograd cvmm':>14} {'their float32':>14}  (max rel)")
  for name, value in ref.items():
    print(f"{name:>16} {np.max(np.abs(value)):10.3e} {max_rel(check[name], value):14.2e} "
          f"{max_rel(as_is32[name], value):14.2e}")

  save(path, params, ref, as_is32, commit, sources, torch_version,
       x=x, r=r, shape=np.array([D_MODEL, N_HEADS, HEAD_DIM, N_EXPERTS, TOP_K, BATCH, SEQ]),
       rotate_fraction=np.float64(ROTATE_FRACTION), rope_base=np.float64(ROPE_BASE))


def make_xl(path, modules, commit, sources, torch_version) -> None:
  import torch  # pylint: disable=import-outside-toplevel
  hd = N_HEADS * HEAD_DIM
  shapes = {"q.weight": (hd, D_MODEL), "k.weight": (hd, D_MODEL),
            "v": (N_HEADS * N_EXPERTS, D_MODEL, HEAD_DIM),
            "o": (N_HEADS * N_EXPERTS, HEAD_DIM, D_MODEL),
            "sel_v": (N_HEADS * N_EXPERTS, D_MODEL), "sel_o": (N_HEADS * N_EXPERTS, D_MODEL),
            "pos_to_pk": (hd, D_MODEL)}
  params, ctx, r = draw(np.random.default_rng(SEED_XL), shapes, PARAM_STD_XL, MEM + SEG, SEG)
  # The V router reads every context row, the O router the segment's.
  margin = min(topk_margin(params["sel_v"], ctx), topk_margin(params["sel_o"], ctx[:, MEM:]))
  assert margin > MIN_TOPK_MARGIN, f"near-tie in a top-{TOP_K} ({margin:.2e}): change SEED_XL"

  common = (*modules, params, ctx, r)
  ref = run_xl(*common, torch.float64, exact64=True)
  check = run_xl(*common, torch.float64, exact64=True, autograd_cvmm=True)
  as_is32 = run_xl(*common, torch.float32, exact64=False)
  released = run_xl(*common, torch.float64, exact64=True, as_released=True)
  assert_same_backward(ref, check)
  print(f"XL: top-{TOP_K} margin {margin:.3e}")
  print(f"{'array':>16} {'max|ref|':>10} {'autograd cvmm':>14} {'their float32':>14} "
        f"{'as released':>12}  (max rel)")
  for name, value in ref.items():
    print(f"{name:>16} {np.max(np.abs(value)):10.3e} {max_rel(check[name], value):14.2e} "
          f"{max_rel(as_is32[name], value):14.2e} {max_rel(released[name], value):12.2e}")

  save(path, params, ref, as_is32, commit, sources, torch_version,
       x=ctx, r=r, out_as_released=released["out"],
       shape=np.array([D_MODEL, N_HEADS, HEAD_DIM, N_EXPERTS, TOP_K, BATCH, MEM, SEG]))


def main() -> None:
  parser = arg_parser(__doc__.splitlines()[0], "switchhead")
  parser.add_argument("--out", default=OUT)
  parser.add_argument("--out_xl", default=OUT_XL)
  args = parser.parse_args()

  import torch  # pylint: disable=import-outside-toplevel
  # (their package, switchhead/cvmm.py, switchhead/switchhead.py)
  modules, commit, sources = import_authors(args.authors_src, args.authors_commit,
                                            "switchhead", "switchhead")
  make_rope(args.out, modules, commit, sources, torch.__version__)
  make_xl(args.out_xl, modules, commit, sources, torch.__version__)


if __name__ == "__main__":
  main()
