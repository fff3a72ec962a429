"""Rebuilds `outputs.npz`: the authors' MoEUT stack (and their LM around it), float64.

  git --git-dir=<moeut.git> archive HEAD | tar -x -C /tmp/moeut_src
  python tests/data/moeut_reference/make_reference.py --authors_src /tmp/moeut_src \
      --authors_commit $(git --git-dir=<moeut.git> rev-parse HEAD)

Needs torch (CPU is enough; their `cvmm.py` imports triton, which must be installed but never
runs) and a checkout of RobertCsordas/moeut (`moeut/` under `--authors_src`);
`--authors_commit` may be left out when `--authors_src` is a git work tree. Their code is
imported from that path at generation time and never copied here: the test
(`tests/models/test_moeut_authors.py`) reads only the npz.

What runs (their `moeut/moeut.py`):
- `MoEUT` (the layer stack, hidden states in and out): d_model 24, n_layers 4 in
  group_size G = 2 shared `MoEUTLayer`s (run ABAB: layer r*G + g is group g at repeat r,
  lines 416-420), each a `SwitchHeadRope` (2 heads x d_head 8, 4 experts, top-2, RoPE on
  `int(0.5 * 8)` = 4 channels, base 10000) and a `SigmaMoE` (6 experts of expert_size 8,
  top-2), dropout, expert dropouts 0, their default regulariser coefficients
  (`entropy_reg` 0.01 for the FF, `att_entropy_reg` 0.001 for attention), in training mode
  (the routers' logits are kept for the regulariser only when `self.training`, lines 89, 249).
  Input x [2, 5, 24] with their LM's causal mask (`AttentionMask(None, triu(ones, 1))`,
  lines 471-472 and 479-480): `MoEUT.forward` cannot run without a mask (`attend` inverts it,
  `~mask`, line 366). Loss `sum(out * R) + reg_loss`, their `MoEUTOutput.reg_loss` (lines
  422-428) as their `example.py` adds it; gradients wrt x and every weight, and those of
  `reg_loss` alone wrt x, the routers and the LayerNorms (`reg_grad/...`).
- `MoEUTLM` (their embedding, the same stack, `out_norm`, `lm_head` with bias) on tokens
  [2, 5] of a vocabulary of 11, the stack holding the same weights: logits, reg_loss and the
  gradients of `sum(logits * R_lm) + reg_loss` wrt the LM's own weights (embedding, out_norm,
  lm_head; the embedding's gradient has gone through the whole stack).

The regulariser is also saved per group and router, unscaled: their `SigmaMoE.get_reg_loss`
(line 82) and, for SwitchHead, the O and V terms that `SwitchHeadCore.get_reg_loss` sums
(line 228, `i` = 0 the O router, 1 the V router: `sel_hist` holds `(o_sel_r, v_sel_r)`,
line 250), each computed here by their `entropy_reg` on the same stacking as line 228 and
checked to add up to what their method returns; and every router's logits per layer (what
`sel_hist` holds), to compare routing before anything else. Their total is accumulated in a
float32 tensor (`torch.zeros(1, dtype=torch.float32)`, line 423: adding the float64 terms
to it keeps float32), so the saved `reg/total` is float32-rounded; `reg/total64` is the same
sum of the saved float64 terms with their coefficients. The gradients are not affected (the
cast passes the cotangent 1 through exactly).

The weights are drawn here (numpy, fixed seed; the LayerNorms' scale and bias random too so
that their mapping is tested) at scales that keep routing and attention far from uniform. A
seed is kept only if no top-K choice of any router, layer, token and head has a near-tie
(K-th minus (K+1)-th sigmoid score > MIN_TOPK_MARGIN, so that float32 rounding cannot flip
a choice): the seed used is saved.

Float64. Their code is not float64 as it stands, so the harness changes the following, each
only for the duration of the calls and without touching their files:
- cvmm (`moeut/cvmm.py`): the two Triton kernels (`cvmm_triton_call`, the forward and
  input-gradient gather-matmul; `cvmm_triton_backward`, the per-expert weight gradient) are
  replaced by plain torch gathers/einsums that compute what the kernels compute (same index
  conventions: `sel_index`, `sel`, `out_index`, the -1 sentinel meaning "write row
  sel_index"); `get_dtype()` (float32 outside autocast: the kernels' output dtype) returns
  float64; their `torch.tensor(-1).cuda()` sentinels stay on the CPU, and `cvmm`'s check of
  the GPU generation (`torch.cuda.get_device_properties(0).major`, line 556, reached before
  the autocast test) sees a non-Volta device. Their `CVMM` autograd function, with its
  hand-written backward, is kept: the gradients saved are theirs. A second run with a pure
  autograd cvmm (gather + einsum) checks that backward here (agreement asserted to 1e-12).
- `get_sel` casts the router logits to float32 (`F.linear(t, w).float()`, moeut.py line 204);
  the harness makes `Tensor.float()` keep float64 tensors as they are while their forward
  runs. The scale buffer (`torch.full`, line 154) is created in float64 (torch's default
  dtype set to float64), and the RoPE `inv_freq` (float32 by construction,
  `torch.arange(...).float()`, line 292) is recomputed in float64 with their formula.
The same weights run through their code in plain float32 (Triton kernels emulated, nothing
else changed) to report how far float32 rounding moves their own result (printed and saved).
"""

import contextlib
import math
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
# Run as a script: the emulation of their CVMM kernels and the torch patches it shares with
# switchhead_reference/make_reference.py are in tests/data/authors_torch.py, one folder up.
sys.path.insert(0, os.path.dirname(HERE))
# pylint: disable=wrong-import-position
from authors_torch import (arg_parser, assert_same_backward, cpu_cvmm, default_dtype,
                           float_keeps_float64, import_authors, load_params, max_rel, patched)
# pylint: enable=wrong-import-position

OUT = os.path.join(HERE, "outputs.npz")

D_MODEL, N_LAYERS, GROUPS = 24, 4, 2
N_HEADS, HEAD_DIM, ATT_E, ATT_K = 2, 8, 4, 2
FF_E, FF_SIZE, FF_K = 6, 8, 2
BATCH, SEQ, VOCAB = 2, 5, 11
ROPE_BASE = 10000.0
SEED = 20241120
MIN_TOPK_MARGIN = 1e-3
# The weights whose gradient of the regulariser alone is saved too (`reg_grad/...`).
REG_GRAD_NAMES = ("sel_v", "sel_o", "expert_sel", "ln1.weight", "ln1.bias", "ln2.weight",
                  "ln2.bias")


def param_std(name: str) -> tuple[float, float]:
  """(mean, std) of each of their weights, by the end of its name: q and k per-channel
  scores of std ~1.5 (on a LayerNorm output), routers logits of std ~2 (sigmoid scores spread
  over (0, 1)), values and experts order-one outputs, LayerNorms near (1, 0) but not equal."""
  d, hd = D_MODEL, N_HEADS * HEAD_DIM
  table = {"q.weight": (0.0, 1.5 / math.sqrt(d)), "k.weight": (0.0, 1.5 / math.sqrt(d)),
           "attention.v": (0.0, 1.0 / math.sqrt(d)), "attention.o": (0.0, 0.7 / math.sqrt(hd)),
           "sel_v": (0.0, 2.0 / math.sqrt(d)), "sel_o": (0.0, 2.0 / math.sqrt(d)),
           "ffn.keys": (0.0, 1.0 / math.sqrt(d)),
           "ffn.values": (0.0, 1.0 / math.sqrt(FF_SIZE * FF_K)),
           "expert_sel": (0.0, 2.0 / math.sqrt(d)),
           "norm.weight": (1.0, 0.2), "ln1.weight": (1.0, 0.2), "ln2.weight": (1.0, 0.2),
           "norm.bias": (0.0, 0.2), "ln1.bias": (0.0, 0.2), "ln2.bias": (0.0, 0.2),
           "embedding.weight": (0.0, 1.0), "lm_head.weight": (0.0, 1.0 / math.sqrt(d)),
           "lm_head.bias": (0.0, 0.5)}
  for suffix, value in table.items():
    if name.endswith(suffix):
      return value
  raise KeyError(name)


# --- the run -------------------------------------------------------------------------------

def build(moeut_module, dtype, lm: bool):
  """Their `MoEUT` (or `MoEUTLM`) at the sizes above, in `dtype`."""
  with default_dtype(dtype):  # the scale buffers (torch.full) are created in it
    if lm:
      model = moeut_module.MoEUTLM(
          VOCAB, D_MODEL, N_LAYERS, N_HEADS, FF_E, ATT_E, d_head=HEAD_DIM, group_size=GROUPS,
          ff_k=FF_K, att_k=ATT_K, ff_expert_dropout=0.0, att_expert_dropout=0.0,
          ff_expert_size=FF_SIZE, dropout=0.0)
    else:
      model = moeut_module.MoEUT(
          D_MODEL, N_LAYERS, N_HEADS, FF_SIZE, FF_E, ATT_E, d_head=HEAD_DIM, att_k=ATT_K,
          ff_k=FF_K, ff_expert_dropout=0.0, att_expert_dropout=0.0, dropout=0.0,
          group_size=GROUPS)
  return model.to(dtype)


def param_shapes(moeut_module, lm: bool) -> dict:
  import torch  # pylint: disable=import-outside-toplevel
  return {name: tuple(p.shape)
          for name, p in build(moeut_module, torch.float32, lm).named_parameters()}


def draw(rng: np.random.Generator, shapes: dict) -> dict:
  params = {}
  for name, shape in shapes.items():
    mean, std = param_std(name)
    params[name] = mean + std * rng.standard_normal(shape)
  return params


def recorded_reg_losses(model, moeut_module, records: dict):
  """Wraps each router module's `get_reg_loss` (instance attribute, their method called as
  is) to record its logits per repeat and its unscaled terms; `records` gets, per group g:
  `logits/layer{r*G+g}/{ff,attn_o,attn_v}`, `reg/group{g}/{ff,attn_o,attn_v}` (tensors)."""
  import torch  # pylint: disable=import-outside-toplevel
  stack = contextlib.ExitStack()
  for g, layer in enumerate(model.layers):
    for module, kind in ((layer.ffn, "ff"), (layer.attention, "attn")):
      original = module.get_reg_loss

      def wrapped(original=original, module=module, kind=kind, g=g):
        hist = list(module.sel_hist)
        assert len(hist) == N_LAYERS // GROUPS, len(hist)
        if kind == "ff":
          for r, logits in enumerate(hist):
            records[f"logits/layer{r * GROUPS + g}/ff"] = logits.detach()
          value = original()
          records[f"reg/group{g}/ff"] = value
          return value
        terms = {}
        for i, router in enumerate(("attn_o", "attn_v")):  # sel_hist: (o_sel_r, v_sel_r)
          for r, pair in enumerate(hist):
            records[f"logits/layer{r * GROUPS + g}/{router}"] = pair[i].detach()
          terms[router] = moeut_module.entropy_reg(
              torch.stack([pair[i] for pair in hist], dim=-3).flatten(-4, -3), -3)
          records[f"reg/group{g}/{router}"] = terms[router]
        value = original()
        tol = 1e-12 if value.dtype == torch.float64 else 1e-5
        assert abs(float((value - terms["attn_o"] - terms["attn_v"]).detach())) < tol * (
            1 + abs(float(value.detach())))
        return value

      stack.enter_context(patched(module, "get_reg_loss", wrapped))
  return stack


def run(modules, params, inputs, r, dtype, *, exact64: bool, lm: bool,
        autograd_cvmm: bool = False, backward: bool = True) -> dict:
  """Their forward, regulariser and `d [sum(out * r) + reg_loss]` wrt the input (the stack:
  x; the LM: none, tokens) and every parameter, as float64 numpy."""
  import torch  # pylint: disable=import-outside-toplevel
  moeut_pkg, cvmm_module, moeut_module = modules
  model = build(moeut_module, dtype, lm)
  stack_model = model.transformer if lm else model
  if exact64:
    for layer in stack_model.layers:
      pe = layer.attention.pe
      n = layer.attention.n_rotate
      pe.inv_freq = 1.0 / (ROPE_BASE ** (torch.arange(0, n, 2, dtype=dtype) / n))
  named = load_params(model, params, dtype)
  model.train()
  records = {}
  rt = torch.as_tensor(r, dtype=dtype)
  with contextlib.ExitStack() as stack:
    stack.enter_context(cpu_cvmm(cvmm_module, moeut_module, dtype, autograd_cvmm))
    stack.enter_context(recorded_reg_losses(stack_model, moeut_module, records))
    if exact64:
      stack.enter_context(float_keeps_float64())
    if lm:
      tokens = torch.as_tensor(inputs, dtype=torch.long)
      result = model(tokens)  # their default mask: causal
    else:
      xt = torch.as_tensor(inputs, dtype=dtype).requires_grad_(True)
      mask = moeut_pkg.AttentionMask(
          None, torch.triu(torch.ones(SEQ, SEQ, dtype=torch.bool), diagonal=1))
      result = model(xt, mask)
    out, reg_loss = result.outputs, result.reg_loss
    assert out.dtype == dtype, out.dtype
    reg_grads = {}
    if backward and not lm:
      # The regulariser's own gradient (its weight in the total is small): wrt x, the
      # routers and the LayerNorms they read.
      names = ["x"] + [n for n in named if n.endswith(REG_GRAD_NAMES)]
      values = torch.autograd.grad(reg_loss.sum(), [xt] + [named[n] for n in names[1:]],
                                   retain_graph=True)
      reg_grads = {f"reg_grad/{n}": v.numpy().astype(np.float64)
                   for n, v in zip(names, values)}
    if backward:
      ((out * rt).sum() + reg_loss.sum()).backward()
  coefs = {"ff": stack_model.entropy_reg, "attn_o": stack_model.att_entropy_reg,
           "attn_v": stack_model.att_entropy_reg}
  total64 = sum(coefs[key.rsplit("/", 1)[1]] * float(value)
                for key, value in records.items() if key.startswith("reg/"))
  got = {"out": out.detach().numpy().astype(np.float64),
         "reg/total": np.float64(float(reg_loss)), "reg/total64": np.float64(total64)}
  for key, value in records.items():
    got[key] = value.detach().numpy().astype(np.float64)
  got.update(reg_grads)
  if backward:
    if not lm:
      got["grad/x"] = xt.grad.numpy().astype(np.float64)
    for name, p in named.items():
      got[f"grad/{name}"] = p.grad.numpy().astype(np.float64)
  return got, (stack_model.entropy_reg, stack_model.att_entropy_reg)


def topk_margin(got: dict) -> float:
  """The smallest K-th minus (K+1)-th sigmoid score over every router, layer, token, head."""
  margins = []
  for key, logits in got.items():
    if key.startswith("logits/"):
      k = FF_K if key.endswith("/ff") else ATT_K
      scores = np.sort(1.0 / (1.0 + np.exp(-logits)), axis=-1)[..., ::-1]
      margins.append(np.min(scores[..., k - 1] - scores[..., k]))
  return float(min(margins))


def draw_all(seed: int, shapes: dict, lm_shapes: dict):
  rng = np.random.default_rng(seed)
  params = draw(rng, shapes)
  x = rng.standard_normal((BATCH, SEQ, D_MODEL))
  r = rng.standard_normal((BATCH, SEQ, D_MODEL))
  lm_only = draw(rng, {k: v for k, v in lm_shapes.items() if not k.startswith("transformer.")})
  lm_params = {f"transformer.{k}": v for k, v in params.items()}
  lm_params.update(lm_only)
  tokens = rng.integers(0, VOCAB, (BATCH, SEQ))
  r_lm = rng.standard_normal((BATCH, SEQ, VOCAB))
  return params, x, r, lm_params, tokens, r_lm


def main() -> None:
  parser = arg_parser(__doc__.splitlines()[0], "moeut")
  parser.add_argument("--out", default=OUT)
  args = parser.parse_args()

  import torch  # pylint: disable=import-outside-toplevel
  # (their package, moeut/cvmm.py, moeut/moeut.py)
  modules, commit, sources = import_authors(args.authors_src, args.authors_commit, "moeut",
                                            "moeut")
  moeut_module = modules[2]
  f64 = torch.float64

  shapes, lm_shapes = param_shapes(moeut_module, False), param_shapes(moeut_module, True)
  for seed in range(SEED, SEED + 100):
    params, x, r, lm_params, tokens, r_lm = draw_all(seed, shapes, lm_shapes)
    margin = min(
        topk_margin(run(modules, params, x, r, f64, exact64=True, lm=False, backward=False)[0]),
        topk_margin(run(modules, lm_params, tokens, r_lm, f64, exact64=True, lm=True,
                        backward=False)[0]))
    if margin > MIN_TOPK_MARGIN:
      break
    print(f"seed {seed}: near-tie in a top-K ({margin:.2e}), next seed")
  else:
    sys.exit("no seed without a near-tie")

  arrays = {}
  for prefix, p, inp, rr, lm in (("", params, x, r, False), ("lm/", lm_params, tokens, r_lm, True)):
    ref, coefs = run(modules, p, inp, rr, f64, exact64=True, lm=lm)
    check, _ = run(modules, p, inp, rr, f64, exact64=True, lm=lm, autograd_cvmm=True)
    as_is32, _ = run(modules, p, inp, rr, torch.float32, exact64=False, lm=lm)
    assert set(check) == set(ref) == set(as_is32)
    assert_same_backward(ref, check, prefix)
    err = abs(ref["reg/total"] - ref["reg/total64"]) / abs(ref["reg/total64"])
    assert err < 1e-6, f"{prefix}their float32 reg_loss vs the float64 terms: {err:.2e}"
    print(f"{prefix or 'stack '}: seed {seed}, top-K margin {margin:.3e}, coefficients {coefs}")
    print(f"{'array':>32} {'max|ref|':>10} {'autograd cvmm':>14} {'their float32':>14}"
          "  (max rel)")
    for name, value in ref.items():
      print(f"{prefix + name:>32} {np.max(np.abs(value)):10.3e} "
            f"{max_rel(check[name], value):14.2e} {max_rel(as_is32[name], value):14.2e}")
    if lm:
      # The LM's stack weights are the stack run's (not saved twice), and so are the
      # stack's gradients of the stack run; keep the LM's own weights' gradients.
      ref = {k: v for k, v in ref.items()
             if not (k.startswith("grad/transformer.") or k.startswith("logits/"))}
      arrays.update({f"lm/param/{k}": v for k, v in p.items()
                     if not k.startswith("transformer.")})
      arrays.update(lm_tokens=tokens, lm_r=r_lm)
    else:
      arrays.update({f"param/{k}": v for k, v in p.items()})
      arrays.update(x=x, r=r)
    arrays.update({f"{prefix}{k}": v for k, v in ref.items()})
    names = [k for k in ref if k in as_is32]
    arrays[f"{prefix}max_rel_their_float32"] = np.array([max_rel(as_is32[k], ref[k])
                                                         for k in names])
    arrays[f"{prefix}max_rel_their_float32_names"] = np.array(names)

  arrays.update(
      shape=np.array([D_MODEL, N_LAYERS, GROUPS, N_HEADS, HEAD_DIM, ATT_E, ATT_K, FF_E,
                      FF_SIZE, FF_K, BATCH, SEQ, VOCAB]),
      shape_names=np.array(["d_model", "n_layers", "groups", "heads", "head_dim", "att_e",
                            "att_k", "ff_e", "ff_size", "ff_k", "batch", "seq", "vocab"]),
      coefs=np.array(coefs), rotate_fraction=np.float64(0.5), rope_base=np.float64(ROPE_BASE),
      layer_norm_eps=np.float64(build(moeut_module, f64, False).layers[0].ln1.eps),
      seed=np.int64(seed), topk_margin=np.float64(margin),
      authors_repo=np.str_("https://github.com/RobertCsordas/moeut"),
      authors_commit=np.str_(commit),
      authors_sha256=np.str_(" ".join(f"{k}:{v}" for k, v in sources.items())),
      torch_version=np.str_(torch.__version__), dtype=np.str_("float64"))
  np.savez_compressed(args.out, **arrays)
  print(f"wrote {args.out} ({os.path.getsize(args.out)} bytes), their commit {commit}, "
        f"torch {torch.__version__}")


if __name__ == "__main__":
  main()
