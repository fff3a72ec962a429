"""The operand dtypes of every matmul and convolution in a lowered program.

Mixed precision is a promise about the program XLA receives: a bfloat16 model whose weights
are float32 silently promotes its matmuls back to float32 (`bf16 @ f32 -> f32`), and nothing
fails. Reading the StableHLO of a lowered step (`jax.jit(f).lower(...).as_text()`) shows what
each `dot_general` and `convolution` really takes; `--compile_only` reports it and the tests
assert it for every model.
"""

import collections
import dataclasses
import math
import re

# `%3 = stablehlo.dot_general %a, %b, ..., contracting_dims = [2] x [0], ... :
#  (tensor<2x3x4xbf16>, tensor<4x5xbf16>) -> tensor<2x3x5xf32>`
_OP = re.compile(r"stablehlo\.(dot_general|convolution)\b")
_SIGNATURE = re.compile(r":\s*\(tensor<([^>]*)>,\s*tensor<([^>]*)>\)\s*->\s*tensor<([^>]*)>")
_CONTRACTING = re.compile(r"contracting_dims\s*=\s*\[([\d,\s]*)\]")
_KERNEL_LAYOUT = re.compile(r"\]x\[([^\]]*)\]->")


@dataclasses.dataclass(frozen=True)
class Contraction:
  """One matmul or convolution: its operands' and result's dtypes, and its FLOPs."""

  op: str  # "dot_general" or "convolution"
  lhs_dtype: str
  rhs_dtype: str
  result_dtype: str
  flops: int  # 2 x multiply-adds

  @property
  def operands(self) -> str:
    return f"{self.lhs_dtype} x {self.rhs_dtype}"


def _tensor(spec: str) -> tuple[tuple[int, ...], str]:
  """`"2x3x4xbf16"` -> `((2, 3, 4), "bf16")`; a scalar `"f32"` -> `((), "f32")`."""
  *dims, dtype = spec.split("x")
  return tuple(int(d) for d in dims), dtype


def _flops(op: str, line: str, lhs: tuple[int, ...], rhs: tuple[int, ...],
           out: tuple[int, ...]) -> int:
  """2 x the multiply-adds: per output element, the contracted size (dot) or the kernel's
  size per output feature (convolution)."""
  if op == "dot_general":
    contracting = _CONTRACTING.search(line)
    dims = [int(d) for d in contracting.group(1).split(",") if d.strip()] if contracting else []
    return 2 * math.prod(out) * math.prod(lhs[d] for d in dims)
  layout = _KERNEL_LAYOUT.search(line)
  kernel_dims = [d.strip() for d in layout.group(1).split(",")] if layout else []
  out_features = rhs[kernel_dims.index("o")] if "o" in kernel_dims else 1
  return 2 * math.prod(out) * math.prod(rhs) // max(out_features, 1)


def contractions(stablehlo_text: str) -> list[Contraction]:
  """Every `dot_general` and `convolution` of a lowered program's StableHLO text."""
  found = []
  for line in stablehlo_text.splitlines():
    op, signature = _OP.search(line), _SIGNATURE.search(line)
    if not (op and signature):
      continue
    (lhs, lhs_dtype), (rhs, rhs_dtype), (out, out_dtype) = map(_tensor, signature.groups())
    found.append(Contraction(op.group(1), lhs_dtype, rhs_dtype, out_dtype,
                             _flops(op.group(1), line, lhs, rhs, out)))
  return found


def flops_by_operands(found: list[Contraction]) -> dict[str, float]:
  """The share of all matmul/convolution FLOPs taken by each operand dtype pair."""
  totals = collections.Counter()
  for c in found:
    totals[c.operands] += c.flops
  total = sum(totals.values()) or 1
  return {operands: flops / total for operands, flops in totals.most_common()}


def describe(found: list[Contraction]) -> str:
  """One line: the operand dtypes by share of FLOPs, e.g. `bf16 x bf16 99.8%, f32 x f32 0.2%`."""
  shares = flops_by_operands(found)
  return ", ".join(f"{operands} {share:.1%}" for operands, share in shares.items())
