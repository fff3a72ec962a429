"""Where a training step's device time goes, by category: traced on a GPU, or the roofline floor
of the program compiled for one on this machine.

    # On a GPU (the default there): a few traced steps, device ms per category, top kernels
    python -m benchmarks.step_profile --config=wt103_s_dense \
        --config.model.dtype=bfloat16 [--steps=5] [--out=DIR]
    # Anywhere (the compile extra, `pip install -e ".[compile]"`): the step compiled for an
    # H100, each category's FLOPs, bytes and roofline floor
    python -m benchmarks.step_profile --config=sigma_moe_paper:wt103_s \
        --config.model.dtype=bfloat16 --deviceless=h100 --out=benchmarks/step_profile
    python -m benchmarks.step_profile --config=switchhead_paper:wt103_s,switchhead \
        --config.model.dtype=bfloat16 --deviceless=h100 --out=benchmarks/step_profile

Both modes read the optimised HLO of the step that training runs (built as `train.py` builds
it: `LMTrainStep` on a device, `compile_only.trace_train_step` without one) and sort its
operations into `CATEGORIES` with `categorize`, a pure function of one operation's record
(`Op`: instruction name, opcode, custom-call target, the JAX `op_name` of its metadata, and
the Python functions of its source stack, which XLA keeps in the module's `StackFrames`).

- `--device`: `--warmup` steps, then `--steps` steps timed (the measured wall ms/step), then
  `--steps` steps under `jax.profiler.trace`, each run as training runs them (the next step
  dispatched while one computes: `LMTrainStep.run`). Each kernel event of the step's program on the
  GPU's stream lines (CUPTI's, on the `/device:GPU:0` plane; on a CPU, XLA's thunk events,
  which is how this mode is tested) names its HLO instruction (`hlo_op`); its time goes to
  that instruction's category. Prints device ms/step per category, the top kernels by name
  (each beside its launch's roofline floor, shapes and the GEMM tiling XLA chose), the
  categories' sum beside the measured step (the rest: gaps between kernels, launch and host
  time; kernels on concurrent streams count twice), and the idle gaps: how long and where the
  device waited between kernels.
- `--deviceless=TARGET`: no device. Every launch of the compiled program (each operation of
  the entry computation, and of while-loop bodies times their trip count, that is not a
  parameter, constant, tuple, bitcast or loop; each branch of a conditional once) gets its
  FLOPs and bytes from the HLO text:
  FLOPs are matmul FLOPs (2 x output elements x contracted size) of dots, cuBLAS calls and
  Triton GEMM fusions, and for our grouped-matmul kernels (Pallas/Mosaic custom calls, `x
  [rows, A]` against `w [E, A, B]`) 2 x rows x A x B; elementwise arithmetic is not counted.
  Bytes are every operand read once and every output written once (fusion parameters that
  are only sliced count what is sliced; in-place updates count the update). Floor of a
  launch = max(FLOPs / peak, bytes / HBM bandwidth) with `roofline.PEAKS` (bf16 peak for
  16-bit operands, the float32 peak otherwise); a category's floor is the sum of its launches'.
  XLA's cost analysis is not used: a deviceless compile returns none (REFERENCE.md 5). Also
  counted: launches per kind (fusions, cuBLAS GEMMs, our kernels, copies) and the pad fusions
  (those XLA puts on GEMM operands, e.g. d_model 412 -> 416, head dim 41 -> 48). `--save_hlo`
  keeps the compiled program's text, `--load_hlo` reports on one without compiling.

Writes `step_profile_<model>_<where>.json` and `.md` into `--out` (`<where>`: the target with
`_deviceless`, or the device); prints the Markdown.
"""

import collections
import dataclasses
import glob
import json
import math
import os
import pathlib
import re
import sys
import tempfile
import time

import jax
import numpy as np
from absl import flags
from ml_collections import config_flags

from benchmarks import machine, roofline
from benchmarks.lm_train_step import LMTrainStep
from sparse_jax import parallel
from sparse_jax.aot import memory, targets
from sparse_jax.cli import config_names
from sparse_jax.config_overrides import switch_kinds
from sparse_jax.tasks import task_for
from sparse_jax.training import compile_only
from sparse_jax.training.placement import Placement

CATEGORIES = {  # key: label
    "matmuls": "matmuls (GEMMs outside attention and MoE)",
    "attention": "attention: scores, softmax, mask, shift",
    "dropout_rng": "dropout and RNG",
    "norms_elementwise": "norms and elementwise",
    "moe": "MoE kernels and routing",
    "copies": "copies, transposes and pads",
    "optimizer": "optimizer (outside the gradient)",
    "other": "other (gathers, scatters, sorts, ...)",
}
TOP = 15

# Opcodes that launch nothing, and the ones holding computations that do.
FREE_OPCODES = frozenset({"parameter", "constant", "get-tuple-element", "tuple", "bitcast",
                          "after-all", "add-dependency", "opt-barrier", "partition-id",
                          "replica-id", "domain"})
CONTROL_OPCODES = frozenset({"while", "conditional", "call"})
MOVE_OPCODES = frozenset({"copy", "transpose", "pad", "slice", "concatenate", "dynamic-slice",
                          "dynamic-update-slice", "reshape", "broadcast", "reverse", "copy-start",
                          "copy-done", "bitcast-convert"})
OTHER_OPCODES = frozenset({"gather", "scatter", "sort", "select-and-scatter", "iota"})
RNG_OPCODES = frozenset({"rng", "rng-bit-generator", "rng-get-and-update-state"})
# A fusion is named by XLA after its root: loop_pad_fusion.3, input_transpose_fusion, ...
_FUSION_ROOT = re.compile(r"^(?:loop_|input_|wrapped_)?([a-z_]+?)(?:_fusion)?(?:[._]\d+)*$")
_MOVE_ROOTS = frozenset(op.replace("-", "_") for op in MOVE_OPCODES)
_OTHER_ROOTS = frozenset(op.replace("-", "_") for op in OTHER_OPCODES) | {"scatter_add"}
_RNG_OP_NAME = re.compile(r"threefry|random_bits|random_wrap|random_unwrap|random_seed|"
                          r"random_fold_in|random_split|bernoulli|rng_bit_generator|/reseed\b")
# A fusion drawing random bits (threefry's rounds), whatever elementwise work it also holds.
_THREEFRY = frozenset({"xor", "shift-left", "shift-right-logical"})
_GRADIENT = re.compile(r"jvp\(|transpose\(jvp|vmap\(jvp")
# Functions of the attention core (scores, relative shift, mask, softmax, the weighted sum).
# Matched against a function's own name (a method's without its class).
_ATTENTION_FUNCTIONS = re.compile(r"^(attend|attend_\w+|rel_shift|\w*mask|\w*softmax\w*|"
                                  r"\w*scores|\w*attention)$")
# sparse_jax/layers/{moe,expert_parallel}.py, the routers and pallas_kernels/ (file stems).
_MOE_MODULES = frozenset({"moe", "expert_parallel", "sigma", "routing", "switch", "sbase",
                          "noisy_topk", "softmax", "expert_mlp", "slot_layout", "triton_matmul",
                          "triton_weight_grad", "mosaic_matmul", "mosaic_weight_grad", "cvmm",
                          "blocked", "ragged", "megablox", "backends", "gather_oracle"})
_MOE_FUNCTIONS = re.compile(r"\.(route|project_v|project_out|_aux|_global_ids)$")
_MOE_OP_NAME = re.compile(r"pallas_call|segment_matmul|cvmm|weight_grad|mosaic")
# Our Pallas kernels by the names they launch under (`pl.pallas_call(name=...)`; a trace of
# a step run as a CUDA graph may name nothing else): the fused XL attention's three
# (pallas_kernels/xl_attention.py) and cuDNN's fused attention; the cvmm kernels.
_ATTENTION_KERNEL = re.compile(r"xl_attention_(forward|dq|dkdv)|fmha|flash_attention")
_MOE_KERNEL = re.compile(r"^cvmm_|segment_matmul|mosaic_gpu")
_GEMM_TARGETS = re.compile(r"cublas|gemm|matmul|cudnn\$conv", re.IGNORECASE)
_GEMM_KERNEL = re.compile(r"gemm|xmma|nvjet|cutlass|cublas|sm\d+_.*mma", re.IGNORECASE)


# The categoriser.

@dataclasses.dataclass(frozen=True)
class Op:
  """What the categoriser reads of one operation (an HLO instruction, or a kernel).

  `stack`: `module:function` of its Python source, innermost first (e.g.
  `xl_attention:attend_relative`); `target`: a custom call's target; `fused`: the opcodes
  inside a fusion. A kernel known by name only has just `name`."""
  name: str
  opcode: str = ""
  op_name: str = ""
  stack: tuple[str, ...] = ()
  target: str = ""
  fused: tuple[str, ...] = ()


def fusion_root(name: str) -> str:
  """The root op XLA named a fusion after (`loop_pad_fusion.3` -> `pad`); '' if none."""
  match = _FUSION_ROOT.match(name)
  return match[1] if match and ("fusion" in name or name.startswith("wrapped_")) else ""


def is_data_movement(op: Op) -> bool:
  """A copy, transpose, pad, slice or concatenation: by opcode, or a fusion named for one
  that computes nothing else (a dtype conversion at most)."""
  if op.opcode in MOVE_OPCODES:
    return True
  if not op.opcode and re.match(r"mem(cpy|set)", op.name, re.IGNORECASE):
    return True  # a copy or fill known by name only (CUPTI's MemcpyD2D, Memset)
  return (op.opcode in ("fusion", "") and fusion_root(op.name) in _MOVE_ROOTS
          and set(op.fused) <= MOVE_OPCODES | FREE_OPCODES | {"convert"})


def is_matmul(op: Op) -> bool:
  if op.opcode in ("dot", "convolution"):
    return True
  if op.opcode == "custom-call":
    return bool(_GEMM_TARGETS.search(op.target))
  if op.opcode == "fusion":  # Triton GEMM fusions, XLA:CPU's ynn/onednn dot fusions, ...
    return "gemm" in op.name or bool({"dot", "convolution"} & set(op.fused))
  return not op.opcode and bool(_GEMM_KERNEL.search(op.name))  # a kernel known by name only


def categorize(op: Op) -> str:
  """The key in `CATEGORIES` of one operation. In order: random bits and dropout masks (a
  fusion computing threefry's rounds counts whole, with the residual add it may hold);
  the optimizer (what the step computes outside the differentiated loss); the
  Transformer-XL relative shift and the fused attention kernels; copies, transposes and pads
  (XLA's, around GEMMs too); MoE layers and their kernels (SwitchHead's expert projections and
  routing too); the attention core (scores, mask, softmax, the weighted sum); the remaining
  matmuls; gathers, scatters and sorts; every other fusion or elementwise operation."""
  functions = [frame.rpartition(":")[2] for frame in op.stack]
  modules = {frame.partition(":")[0] for frame in op.stack}
  if (op.opcode in RNG_OPCODES or _RNG_OP_NAME.search(op.op_name) or _THREEFRY <= set(op.fused)
      or any("dropout" in f.lower() or f == "reseed" for f in functions)):
    return "dropout_rng"
  if (op.op_name.startswith("jit(") and not _GRADIENT.search(op.op_name)
      and not is_data_movement(op)):
    return "optimizer"
  if "rel_shift" in functions or _ATTENTION_KERNEL.search(op.name + " " + op.op_name):
    return "attention"
  if is_data_movement(op):
    return "copies"
  if (modules & _MOE_MODULES or any(_MOE_FUNCTIONS.search(f) for f in functions)
      or _MOE_OP_NAME.search(op.op_name) or "triton" in op.target or "mosaic" in op.target
      or (not op.opcode and _MOE_KERNEL.search(op.name))):
    return "moe"
  if any(_ATTENTION_FUNCTIONS.match(f.rpartition(".")[2]) for f in functions):
    return "attention"
  if is_matmul(op):
    return "matmuls"
  if op.opcode in OTHER_OPCODES or fusion_root(op.name) in _OTHER_ROOTS:
    return "other"
  if op.opcode in ("fusion", "") or op.opcode not in CONTROL_OPCODES | {"custom-call"}:
    return "norms_elementwise"
  return "other"


# The HLO text of a compiled program.

@dataclasses.dataclass
class Instruction:
  name: str
  opcode: str
  shape: str  # the output shape as printed: `bf16[64,256]{1,0}` or a tuple
  operands: list[str]
  attrs: str  # everything after the operands
  op_name: str = ""
  stack_frame: int = 0

  def attr(self, key: str) -> str | None:
    """The value of `key=` (a name, a `{...}` list or a quoted string), None if absent."""
    match = re.search(rf"(?:^|[ ,]){re.escape(key)}=(\{{[^}}]*\}}|\"(?:[^\"\\]|\\.)*\"|[^,\s]+)",
                      self.attrs)
    return match[1] if match else None

  def called(self, key: str) -> list[str]:
    value = self.attr(key)
    return re.findall(r"%?([\w.\-]+)", value) if value else []


@dataclasses.dataclass
class HloModule:
  name: str
  entry: str
  computations: dict[str, list[Instruction]]
  stacks: dict[int, tuple[str, ...]]  # stack frame id -> `module:function`, innermost first

  def __post_init__(self):
    self.by_name = {i.name: i for insts in self.computations.values() for i in insts}
    self.shapes = {name: inst.shape for name, inst in self.by_name.items()}
    # Kernel names: XLA names a fusion's kernel after the instruction, '.' and '-' as '_'.
    self.by_kernel = {re.sub(r"[.\-]", "_", name): i for name, i in self.by_name.items()}

  def op(self, inst: Instruction) -> Op:
    """The categoriser's record of an instruction (a fusion without source of its own takes
    its fused root's)."""
    op_name, frame, fused = inst.op_name, inst.stack_frame, ()
    if inst.opcode == "fusion" and inst.called("calls"):
      computation = inst.called("calls")[0]
      fused = tuple(sorted({i.opcode for i in self.computations.get(computation, [])}))
      root = self.root(computation)
      if not op_name and root:
        op_name, frame = root.op_name, root.stack_frame
    target = (inst.attr("custom_call_target") or "").strip('"')
    return Op(inst.name, inst.opcode, op_name, self.stacks.get(frame, ()), target, fused)

  def root(self, computation: str) -> Instruction | None:
    insts = self.computations.get(computation)
    return insts[-1] if insts else None


_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%([\w.\-]+)\s*=\s*(.*)$")
_COMPUTATION = re.compile(r"^(ENTRY\s+)?%([\w.\-]+)\s.*\{\s*$")


def _matching(text: str, start: int) -> int:
  """The index just past the bracket closing the one at `start` (quotes skipped)."""
  pairs = {"(": ")", "{": "}", "[": "]"}
  depth, quoted, i = 0, False, start
  while i < len(text):
    c = text[i]
    if quoted:
      if c == "\\":
        i += 1
      elif c == '"':
        quoted = False
    elif c == '"':
      quoted = True
    elif c in pairs:
      depth += 1
    elif c in ")}]":
      depth -= 1
      if depth == 0:
        return i + 1
    i += 1
  return len(text)


def parse_instruction(line: str) -> Instruction | None:
  match = _INSTRUCTION.match(line)
  if not match:
    return None
  name, rest = match[1], match[2]
  end = _matching(rest, 0) if rest.startswith("(") else rest.index(" ")
  shape, rest = rest[:end], rest[end:].lstrip()
  opcode_match = re.match(r"([\w\-$.]+)\(", rest)
  if not opcode_match:
    return None
  close = _matching(rest, opcode_match.end() - 1)
  operands = re.findall(r"%([\w.\-]+)", rest[opcode_match.end():close - 1])
  attrs = rest[close:]
  op_name = re.search(r'op_name="((?:[^"\\]|\\.)*)"', attrs)
  frame = re.search(r"stack_frame_id=(\d+)", attrs)
  return Instruction(name, opcode_match[1], shape, operands, attrs,
                     op_name[1] if op_name else "", int(frame[1]) if frame else 0)


def _stack_frames(sections: dict[str, dict[int, str]]) -> dict[int, tuple[str, ...]]:
  """Each stack frame's `module:function` chain, innermost first. XLA prints a frame as
  `{file_location_id=L parent_frame_id=P}`, P one more than the parent's id (1: none)."""
  files, functions = sections.get("FileNames", {}), sections.get("FunctionNames", {})
  locations, frames = {}, {}
  for key, text in sections.get("FileLocations", {}).items():
    fields = dict(re.findall(r"(\w+)=(\d+)", text))
    path = files.get(int(fields.get("file_name_id", 0)), "")
    module = pathlib.PurePath(path).stem
    locations[key] = f"{module}:{functions.get(int(fields.get('function_name_id', 0)), '')}"
  for key, text in sections.get("StackFrames", {}).items():
    fields = dict(re.findall(r"(\w+)=(\d+)", text))
    frames[key] = (int(fields.get("file_location_id", 0)),
                   int(fields.get("parent_frame_id", 1)) - 1)
  stacks = {}
  for key in frames:
    chain, frame, seen = [], key, set()
    while frame in frames and frame not in seen:
      seen.add(frame)
      location, parent = frames[frame]
      chain.append(locations.get(location, ":"))
      frame = parent
    stacks[key] = tuple(chain)
  return stacks


def parse_hlo(text: str) -> HloModule:
  """The computations (instructions in order) and source stacks of an HLO module's text."""
  lines = text.splitlines()
  module = re.match(r"HloModule\s+([\w.\-]+)", lines[0]) if lines else None
  computations, sections, entry = {}, {}, ""
  current, section = None, None
  for line in lines[1:]:
    if current is not None:
      if line.startswith("}"):
        current = None
      else:
        inst = parse_instruction(line)
        if inst:
          current.append(inst)
      continue
    header = _COMPUTATION.match(line)
    if header:
      current = computations.setdefault(header[2], [])
      entry = header[2] if header[1] else entry
      section = None
    elif line.strip() in ("FileNames", "FunctionNames", "FileLocations", "StackFrames"):
      section = sections.setdefault(line.strip(), {})
    elif section is not None and re.match(r"^\d+ ", line):
      key, _, value = line.partition(" ")
      section[int(key)] = value.strip().strip('"')
  return HloModule(module[1] if module else "", entry, computations, _stack_frames(sections))


# Bytes and FLOPs of a launch.

_BYTES = {"pred": 1, "s4": 0.5, "u4": 0.5, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2,
          "bf16": 2, "s32": 4, "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8,
          "c128": 16, "token": 0}
_ARRAY = re.compile(r"\b([a-z]+[0-9]*(?:e\d+m\d+\w*)?)\[([0-9,]*)\]")


def arrays(shape: str) -> list[tuple[str, tuple[int, ...]]]:
  """(dtype, dims) of every array in a printed shape (a tuple's elements in order)."""
  return [(dtype, tuple(int(d) for d in dims.split(",") if d))
          for dtype, dims in _ARRAY.findall(shape)]


def nbytes(shape: str) -> float:
  return sum(_BYTES.get(dtype, 1) * math.prod(dims) for dtype, dims in arrays(shape))


def _dims(value: str | None) -> list[int]:
  return [int(d) for d in re.findall(r"\d+", value or "")]


@dataclasses.dataclass
class Cost:
  flops: float = 0.0
  bytes: float = 0.0
  narrow: bool = True  # matmul operands of 16 bits or fewer (the bf16 peak applies)


def dot_flops(inst: Instruction, shapes: dict[str, str]) -> tuple[float, bool]:
  """2 x output elements x contracted size of a dot, and whether its operands are narrow."""
  lhs = arrays(shapes.get(inst.operands[0], "")) if inst.operands else []
  out = arrays(inst.shape)
  if not lhs or not out:
    return 0.0, True
  contracted = math.prod(lhs[0][1][d] for d in _dims(inst.attr("lhs_contracting_dims"))
                         if d < len(lhs[0][1]))
  return 2.0 * math.prod(out[0][1]) * contracted, _narrow(inst, shapes)


def gemm_call_flops(inst: Instruction, shapes: dict[str, str]) -> tuple[float, bool]:
  """A cuBLAS custom call: its dot dimensions are in the backend config."""
  lhs = arrays(shapes.get(inst.operands[0], "")) if inst.operands else []
  out = arrays(inst.shape)
  match = re.search(r'"lhs_contracting_dimensions":\[([^\]]*)\]', inst.attrs)
  if not lhs or not out or not match:
    return 0.0, True
  contracted = math.prod(lhs[0][1][d] for d in _dims(match[1]) if d < len(lhs[0][1]))
  return 2.0 * math.prod(out[0][1]) * contracted, _narrow(inst, shapes)


def grouped_matmul_flops(inst: Instruction, shapes: dict[str, str]) -> tuple[float, bool]:
  """A grouped-matmul kernel (cvmm: `x [rows, A]` by `w [E, A, B]` into `[rows, B]`, or the
  weight gradient into `[E, A, B]`): 2 x rows x A x B, rows the most of any 2-D array."""
  all_arrays = arrays(inst.shape) + [a for o in inst.operands for a in arrays(shapes.get(o, ""))]
  weights = [dims for _, dims in all_arrays if len(dims) == 3]
  rows = [dims[0] for _, dims in all_arrays if len(dims) == 2]
  if not weights or not rows:
    return 0.0, True
  _, a, b = weights[0]
  return 2.0 * max(rows) * a * b, _narrow(inst, shapes)


def _narrow(inst: Instruction, shapes: dict[str, str]) -> bool:
  """Whether the matrix operands (2-D or more) are all of 16 bits or fewer: the bf16 peak
  applies (an f32 result accumulated from them does not change that)."""
  operands = [a for o in inst.operands for a in arrays(shapes.get(o, ""))]
  return all(_BYTES.get(dtype, 4) <= 2 for dtype, dims in operands if len(dims) >= 2)


def _fused_flops(module: HloModule, computation: str, seen=None) -> tuple[float, bool]:
  """Matmul FLOPs of the dots inside a fused computation (nested fusions too)."""
  seen = seen if seen is not None else set()
  if computation in seen:
    return 0.0, True
  seen.add(computation)
  flops, narrow = 0.0, True
  for inst in module.computations.get(computation, []):
    if inst.opcode == "dot":
      f, n = dot_flops(inst, module.shapes)
    elif inst.opcode == "fusion" and inst.called("calls"):
      f, n = _fused_flops(module, inst.called("calls")[0], seen)
    else:
      continue
    flops += f
    narrow = narrow and (n or f == 0)
  return flops, narrow


def _fusion_bytes(module: HloModule, inst: Instruction) -> float:
  """Bytes a fusion moves: each parameter read once (only the sliced part of one used only
  by slices), the output written once (only the update of an in-place update)."""
  computation = module.computations.get(inst.called("calls")[0], []) if inst.called("calls") else []
  params = [i.name for i in computation if i.opcode == "parameter"]
  users = collections.defaultdict(list)
  for i in computation:
    for operand in i.operands:
      users[operand].append(i)
  root = computation[-1] if computation else None
  roots = ([module.by_name[o] for o in root.operands if o in module.by_name]
           if root is not None and root.opcode == "tuple" else [root] if root else [])
  in_place = {}  # parameter name -> bytes the update writes
  for r in roots:
    if r.opcode == "dynamic-update-slice" and len(r.operands) > 1:
      in_place[r.operands[0]] = nbytes(module.shapes.get(r.operands[1], ""))
    elif r.opcode == "scatter" and len(r.operands) > 2:
      in_place[r.operands[0]] = nbytes(module.shapes.get(r.operands[2], ""))
  total = nbytes(inst.shape)
  for r in roots:
    if r.opcode in ("dynamic-update-slice", "scatter") and r.operands[0] in in_place:
      total += in_place[r.operands[0]] - nbytes(r.shape)
  for name in params:
    if name in in_place:
      continue
    uses = users.get(name, [])
    if uses and all(u.opcode in ("dynamic-slice", "slice", "gather") and u.operands[0] == name
                    for u in uses):
      total += sum(nbytes(u.shape) for u in uses)
    else:
      total += nbytes(module.shapes.get(name, ""))
  return total


def launch_cost(module: HloModule, inst: Instruction) -> Cost:
  """FLOPs and bytes of one launch (module docstring)."""
  shapes = module.shapes
  if inst.opcode == "fusion":
    flops, narrow = (_fused_flops(module, inst.called("calls")[0]) if inst.called("calls")
                     else (0.0, True))
    return Cost(flops, _fusion_bytes(module, inst), narrow)
  out_shape = inst.shape
  flops, narrow = 0.0, True
  if inst.opcode == "dot":
    flops, narrow = dot_flops(inst, shapes)
  elif inst.opcode == "custom-call":
    target = inst.attr("custom_call_target") or ""
    if _GEMM_TARGETS.search(target):
      flops, narrow = gemm_call_flops(inst, shapes)
      out_shape = " ".join(f"{d}[{','.join(map(str, s))}]" for d, s in arrays(inst.shape)[:1])
    elif "triton" in target or "mosaic" in target:
      flops, narrow = grouped_matmul_flops(inst, shapes)
  read = sum(nbytes(shapes.get(o, "")) for o in inst.operands)
  return Cost(flops, read + nbytes(out_shape), narrow)


# The launches of a program.

def trip_count(inst: Instruction) -> int | None:
  match = re.search(r'"known_trip_count":\{"n":"(\d+)"', inst.attrs)
  return int(match[1]) if match else None


def launches(module: HloModule, computation: str | None = None, times: int = 1,
             unknown_trips: list | None = None):
  """`(instruction, times it runs per step)` of every launch of `computation` (the entry),
  into loops (a while body `n` times for XLA's known trip count `n`; an unknown count is
  taken as 1 and its loop named in `unknown_trips`), conditionals' branches and calls."""
  for inst in module.computations.get(computation or module.entry, []):
    if inst.opcode in FREE_OPCODES:
      continue
    if inst.opcode == "while":
      trips = trip_count(inst)
      if trips is None and unknown_trips is not None:
        unknown_trips.append(inst.name)
      for body in inst.called("body"):
        yield from launches(module, body, times * (trips or 1), unknown_trips)
      for condition in inst.called("condition"):
        yield from launches(module, condition, times * ((trips or 1) + 1), unknown_trips)
    elif inst.opcode == "conditional":
      for branch in (inst.called("branch_computations") + inst.called("true_computation")
                     + inst.called("false_computation")):
        yield from launches(module, branch, times, unknown_trips)
    elif inst.opcode == "call":
      for called in inst.called("to_apply"):
        yield from launches(module, called, times, unknown_trips)
    else:
      yield inst, times


def base_name(name: str) -> str:
  """An instruction or kernel name without its numeric suffix (`loop_add_fusion.12` ->
  `loop_add_fusion`): the family a top list groups by."""
  return re.sub(r"([._]\d+)+$", "", name)


# Deviceless: the floor of each category.

def floor_seconds(cost: Cost, peaks) -> float:
  """A launch's roofline floor: max(FLOPs / the peak of its operands' width, bytes / HBM
  bandwidth), against `peaks` (`roofline.DevicePeaks`)."""
  dtype = "bfloat16" if cost.narrow else "float32"
  return max(cost.flops / (peaks.tflops[dtype] * 1e12), cost.bytes / (peaks.hbm_tb_s * 1e12))


def deviceless_rows(module: HloModule, peaks) -> tuple[list[dict], list[str]]:
  """One row per launch: name, opcode, category, launches per step, FLOPs, bytes, floor (s);
  and the while loops whose trip count XLA did not know."""
  unknown: list[str] = []
  rows = []
  for inst, times in launches(module, unknown_trips=unknown):
    cost = launch_cost(module, inst)
    op = module.op(inst)
    floor_s = floor_seconds(cost, peaks)
    rows.append({"name": inst.name, "opcode": inst.opcode, "target": op.target,
                 "op_name": op.op_name, "source": op.stack[0] if op.stack else "",
                 "category": categorize(op), "launches": times, "flops": cost.flops * times,
                 "bytes": cost.bytes * times, "floor_s": floor_s * times,
                 "pad": fusion_root(inst.name) == "pad" or inst.opcode == "pad",
                 "gemm_pad": (fusion_root(inst.name) == "pad" or inst.opcode == "pad")
                             and op.op_name.endswith("dot_general")})
  return rows, unknown


def summarize_deviceless(rows: list[dict]) -> dict:
  """Per category: launches, FLOPs, bytes, floor ms and share of the total floor; the top
  families of launches (a name without its number, within a category) by floor; the pads."""
  total_s = sum(r["floor_s"] for r in rows) or 1.0
  categories = []
  for key, label in CATEGORIES.items():
    mine = [r for r in rows if r["category"] == key]
    floor_s = sum(r["floor_s"] for r in mine)
    categories.append({"category": key, "label": label,
                       "launches": sum(r["launches"] for r in mine),
                       "flops": sum(r["flops"] for r in mine),
                       "bytes": sum(r["bytes"] for r in mine), "floor_ms": floor_s * 1e3,
                       "share": floor_s / total_s})
  families = collections.defaultdict(lambda: {"launches": 0, "flops": 0.0, "bytes": 0.0,
                                              "floor_s": 0.0})
  for r in rows:
    name = base_name(r["name"]) + (f" ({r['target']})" if r["target"] else "")
    for key in ("launches", "flops", "bytes", "floor_s"):
      families[name, r["category"]][key] += r[key]
  top = sorted(families.items(), key=lambda item: -item[1]["floor_s"])[:TOP]
  pads = [r for r in rows if r["pad"]]
  gemm_pads = [r for r in pads if r["gemm_pad"]]
  return {
      "categories": categories,
      "total": {"launches": sum(r["launches"] for r in rows),
                "flops": sum(r["flops"] for r in rows), "bytes": sum(r["bytes"] for r in rows),
                "floor_ms": total_s * 1e3 if rows else 0.0},
      "top": [{"name": name, "category": category, "launches": f["launches"],
               "flops": f["flops"], "bytes": f["bytes"], "floor_ms": f["floor_s"] * 1e3}
              for (name, category), f in top],
      "pads": {"launches": sum(r["launches"] for r in pads),
               "bytes": sum(r["bytes"] for r in pads),
               "floor_ms": sum(r["floor_s"] for r in pads) * 1e3,
               "around_gemms": sum(r["launches"] for r in gemm_pads)},
      "launch_kinds": launch_kinds(rows),
  }


def launch_kinds(rows: list[dict]) -> dict[str, int]:
  """Launches per step by kind: fusions, cuBLAS GEMMs, other custom calls (our kernels),
  copies, ..."""
  kinds = collections.Counter()
  for r in rows:
    kind = ("cuBLAS GEMM" if _GEMM_TARGETS.search(r["target"]) else
            f"custom call {r['target']}" if r["target"] else r["opcode"])
    kinds[kind] += r["launches"]
  return dict(kinds.most_common())


def deviceless_report(hlo_text: str, peaks) -> dict:
  """The deviceless breakdown of a compiled program's HLO text against `peaks`
  (`roofline.DevicePeaks`)."""
  module = parse_hlo(hlo_text)
  rows, unknown = deviceless_rows(module, peaks)
  return {"mode": "deviceless", "module": module.name, "peaks": dataclasses.asdict(peaks),
          "unknown_trip_counts": unknown, **summarize_deviceless(rows)}


# On a device: kernels of a trace.

@dataclasses.dataclass(frozen=True)
class KernelEvent:
  kernel: str  # the kernel's name (CUPTI's on a GPU; the thunk's on a CPU)
  hlo_op: str  # the HLO instruction that launched it ('' if the event does not say)
  duration_ns: float
  start_ns: float = 0.0


def kernel_events(profile, module: str) -> list[KernelEvent]:
  """The kernels `module` ran in a `jax.profiler.ProfileData`: the events of the first GPU's
  stream lines (`Stream #N(...)` on `/device:GPU:0`; each kernel carries the `hlo_op` and
  `hlo_module` XLA annotated its launch with), or where there is no GPU plane, XLA:CPU's
  thunk events (`tf_XLA...` lines of `/host:CPU`). Events of other programs are left out."""
  gpu = sorted((p for p in profile.planes if p.name.startswith("/device:GPU:")),
               key=lambda p: p.name)
  if gpu:
    lines = [line for line in gpu[0].lines if line.name.startswith("Stream")]
  else:
    lines = [line for plane in profile.planes if plane.name == "/host:CPU"
             for line in plane.lines if line.name.startswith("tf_XLA")]
  events = []
  for line in lines:
    for event in line.events:
      stats = dict(event.stats)
      if stats.get("hlo_module") != module:
        continue
      events.append(KernelEvent(event.name, str(stats.get("hlo_op", "")), event.duration_ns,
                                event.start_ns))
  return events


def traced_events(run, module: str) -> list[KernelEvent]:
  """`kernel_events` of `module` while `run()` runs under `jax.profiler.trace`."""

  with tempfile.TemporaryDirectory() as trace_dir:
    with jax.profiler.trace(trace_dir):
      run()
    events, seen = [], []
    for path in glob.glob(os.path.join(trace_dir, "**", "*.xplane.pb"), recursive=True):
      profile = jax.profiler.ProfileData.from_file(path)
      events += kernel_events(profile, module)
      seen += [f"{plane.name}: {', '.join(line.name for line in plane.lines)[:200]}"
               for plane in profile.planes]
  if not events:
    raise RuntimeError(f"no kernel events of {module} in the trace; its planes and lines: "
                       + "; ".join(seen))
  return events


def event_instruction(module: HloModule, event: KernelEvent) -> Instruction | None:
  """A kernel's HLO instruction: by `hlo_op`, else by the kernel's name (which XLA derives
  from the instruction's); None when neither names one."""
  return (module.by_name.get(event.hlo_op) or module.by_name.get(event.kernel)
          or module.by_kernel.get(event.kernel))


def kernel_op(module: HloModule, event: KernelEvent) -> Op:
  """The categoriser's record of a kernel: its HLO instruction's (`event_instruction`), or
  its name alone."""
  inst = event_instruction(module, event)
  return module.op(inst) if inst is not None else Op(event.kernel)


def idle_gaps(events: list[KernelEvent], steps: int, largest: int = 5) -> dict:
  """Where the device waited between `events` (of `steps` steps, on any stream): the idle time
  per step (between the first kernel's start and the last one's end, time no kernel ran) and
  the `largest` gaps with the kernels on either side, so that gaps between steps (the host
  dispatching the next one) and inside a step (launches the kernels cannot hide) tell apart."""
  gaps, busy_until, last = [], None, ""
  for event in sorted(events, key=lambda e: e.start_ns):
    if busy_until is not None and event.start_ns > busy_until:
      gaps.append((event.start_ns - busy_until, last, event.kernel))
    end = event.start_ns + event.duration_ns
    if busy_until is None or end >= busy_until:
      busy_until, last = end, event.kernel
  gaps.sort(key=lambda gap: -gap[0])
  return {"ms": sum(g[0] for g in gaps) / 1e6 / steps, "gaps": len(gaps) / steps,
          "largest": [{"ms": ns / 1e6, "after": after, "before": before}
                      for ns, after, before in gaps[:largest]]}


def _gemm_tiles(inst: Instruction) -> str:
  """The tiling XLA chose for a Triton GEMM fusion (its backend config's
  `triton_gemm_config`: block_m/n/k, split_k, stages, warps), '' for other launches."""
  match = re.search(r'"triton_gemm_config":\{([^}]*)\}', inst.attrs)
  if not match:
    return ""
  fields = dict(re.findall(r'"(\w+)":"?(\d+)"?', match[1]))
  keys = ("block_m", "block_n", "block_k", "split_k", "num_stages", "num_warps")
  return " ".join(f"{key.removeprefix('num_')}={fields[key]}" for key in keys if key in fields)


def kernel_floor(module: HloModule, event: KernelEvent, peaks) -> dict:
  """What one launch of the event's instruction (`event_instruction`) moves and multiplies
  (`launch_cost`), its roofline floor against `peaks` (None without peaks for the device), its
  operand and output shapes, and the GEMM tiling XLA picked (`_gemm_tiles`)."""
  inst = event_instruction(module, event)
  if inst is None:
    return {}
  cost = launch_cost(module, inst)
  floor_ms = None if peaks is None else 1e3 * floor_seconds(cost, peaks)
  bare = lambda shape: re.sub(r"\{[^}]*\}", "", shape)  # without the layout
  shapes = ", ".join(bare(module.shapes.get(o, "")) for o in inst.operands[:3])
  return {"flops": cost.flops, "bytes": cost.bytes, "floor_ms": floor_ms,
          "shapes": f"{shapes} -> {bare(inst.shape)}"[:160], "tiles": _gemm_tiles(inst)}


def summarize_device(module: HloModule, events: list[KernelEvent], steps: int,
                     wall_ms: float, peaks=None) -> dict:
  """Per category: kernels and device ms per step, share of the kernels' time; the top
  kernels by name, each with its first instruction's floor per launch (`kernel_floor`,
  against `peaks`); the kernels' sum beside the measured wall time of a step, and the idle
  gaps (`idle_gaps`)."""
  ops = {}
  per_kernel = collections.defaultdict(lambda: {"ns": 0.0, "calls": 0, "hlo_ops": set(),
                                                "category": "other"})
  per_category = collections.defaultdict(lambda: {"ns": 0.0, "calls": 0})
  for event in events:
    key = (event.hlo_op, event.kernel)
    if key not in ops:
      op = kernel_op(module, event)
      ops[key] = None if op.opcode in CONTROL_OPCODES else categorize(op)
    category = ops[key]
    if category is None:  # XLA:CPU's loop thunks enclose their bodies' events.
      continue
    per_category[category]["ns"] += event.duration_ns
    per_category[category]["calls"] += 1
    kernel = per_kernel[event.kernel]
    kernel["ns"] += event.duration_ns
    kernel["calls"] += 1
    kernel["category"] = category
    if event.hlo_op:
      kernel["hlo_ops"].add(event.hlo_op)
  total_ns = sum(c["ns"] for c in per_category.values())
  counted = sum(c["calls"] for c in per_category.values())
  device_ms = total_ns / 1e6 / steps
  categories = [{"category": key, "label": label,
                 "kernels": per_category[key]["calls"] / steps,
                 "ms": per_category[key]["ns"] / 1e6 / steps,
                 "share": per_category[key]["ns"] / total_ns if total_ns else 0.0}
                for key, label in CATEGORIES.items()]
  top = sorted(per_kernel.items(), key=lambda item: -item[1]["ns"])[:TOP]
  return {
      "categories": categories,
      "total": {"kernels": counted / steps, "ms": device_ms, "wall_ms": wall_ms,
                "device_over_wall": device_ms / wall_ms if wall_ms else None},
      "top": [{"name": name, "category": k["category"], "calls": k["calls"] / steps,
               "ms": k["ns"] / 1e6 / steps, "share": k["ns"] / total_ns if total_ns else 0.0,
               "hlo_ops": sorted(k["hlo_ops"])[:3],
               "launch": kernel_floor(
                   module, KernelEvent(name, min(k["hlo_ops"], default=""), 0.0), peaks)}
              for name, k in top],
      "idle": idle_gaps([e for e in events if ops[e.hlo_op, e.kernel] is not None], steps),
      "steps": steps,
  }


def device_report(train_step, batch, *, steps: int, warmup: int) -> dict:
  """The device breakdown of `train_step` (`benchmarks.lm_train_step.LMTrainStep`) on
  `batch`: compiled if it is not yet, `warmup` steps, `steps` timed steps (wall ms/step),
  `steps` traced steps, run as training runs them (`LMTrainStep.run`: a step is dispatched
  while the one before computes, so the gaps between steps are the ones training has)."""

  if not isinstance(train_step.step_fn, jax.stages.Compiled):
    train_step.compile(batch)
  module = parse_hlo(train_step.step_fn.as_text())
  with jax.set_mesh(train_step.mesh):
    if warmup:
      train_step.run(batch, 0, warmup)
    start = time.perf_counter()
    train_step.run(batch, warmup, steps)
    wall_ms = (time.perf_counter() - start) * 1e3 / steps
    events = traced_events(lambda: train_step.run(batch, warmup + steps, steps), module.name)
  device = jax.devices()[0]
  return {"mode": "device", "module": module.name, "device_kind": device.device_kind,
          "platform": device.platform, "warmup": warmup,
          **summarize_device(module, events, steps, wall_ms,
                             roofline.device_peaks(device.device_kind))}


# Building the step.

def model_name(config_path: str) -> str:
  """`sigma_moe_paper:wt103_s` (or a file `path/sigma_moe_paper.py:wt103_s`) ->
  `sigma_moe_paper_wt103_s`."""
  path, _, argument = config_path.partition(":")
  name = pathlib.PurePath(path).stem + (f"_{argument}" if argument else "")
  return re.sub(r"[^\w]+", "_", name).strip("_")


def compile_step(task, target=None) -> tuple[jax.stages.Compiled, dict]:
  """`task`'s training step as `train.py` builds it, compiled for `target`
  (`aot.targets.Target`; JAX must be on the CPU backend) or, with None, for one of this
  machine's devices; and the XLA options it needed."""
  if target is None:  # one device, as the device mode runs
    mesh = parallel.make_mesh(parallel.mesh_shape(task.typed.mesh, 1))
  else:
    mesh = compile_only.target_mesh(task, target)
  placement = Placement(mesh)
  task.check_mesh(placement)
  task.check_accumulation(placement)
  with jax.set_mesh(mesh):
    traced = compile_only.trace_train_step(task, placement)[0]
    if target is None:
      return traced.lower().compile(), {}
    return compile_only.compile_for(compile_only.lower_for(traced, target), target)


# The report.

def _fmt(value: float, digits: int = 2) -> str:
  return f"{value:,.{digits}f}"


def markdown(report: dict) -> str:
  """The report's tables."""
  where = (f"{report['target']} compiled on this machine (deviceless)"
           if report["mode"] == "deviceless" else report["device_kind"])
  lines = [f"### `{report['config']}`: {where}", "",
           f"{report['dtype']} compute, float32 parameters, batch {report['batch_size']} x "
           f"{report['seq_len']}; module `{report['module']}`."]
  if report.get("command"):
    lines.append(f"Command: `{report['command']}`.")
  lines.append("")
  total = report["total"]
  if report["mode"] == "deviceless":
    peaks = report["peaks"]
    lines += [f"Roofline floor per launch = max(FLOPs / {peaks['tflops']['bfloat16']:g} "
              f"TFLOP/s (bf16 operands; {peaks['tflops']['float32']:g} f32), bytes / "
              f"{peaks['hbm_tb_s']:g} TB/s); FLOPs: matmuls only.", "",
              "| category | launches | GFLOP | GB | floor ms | share |",
              "|---|---:|---:|---:|---:|---:|"]
    for c in report["categories"]:
      lines.append(f"| {c['label']} | {c['launches']:,} | {_fmt(c['flops'] / 1e9, 1)} | "
                   f"{_fmt(c['bytes'] / 1e9)} | {_fmt(c['floor_ms'])} | {c['share']:.1%} |")
    lines.append(f"| **total** | {total['launches']:,} | {_fmt(total['flops'] / 1e9, 1)} | "
                 f"{_fmt(total['bytes'] / 1e9)} | {_fmt(total['floor_ms'])} | 100% |")
    if report.get("memory"):  # compiled here, not read from --load_hlo
      step_memory = report["memory"]
      lines += ["", f"Traced and compiled in {report['compile_s']:.1f} s on this machine. Memory "
                    f"per device: {step_memory['total_bytes'] / memory.GIB:.2f} GiB "
                    f"({step_memory['temporary_bytes'] / memory.GIB:.2f} GiB temporaries)."]
    if report.get("xla_options"):
      lines += ["", f"Compiled with XLA options {report['xla_options']} (the GEMMs go to cuBLAS: "
                    "`sparse_jax/training/xla_fallbacks.py`)."]
    pads = report["pads"]
    kinds = ", ".join(f"{kind} {count:,}" for kind, count in report["launch_kinds"].items())
    lines += ["", f"Launches: {kinds}. Pad fusions: {pads['launches']:,} "
                  f"({pads['around_gemms']:,} on GEMM operands), {_fmt(pads['bytes'] / 1e9)} GB, "
                  f"floor {_fmt(pads['floor_ms'])} ms."]
    if report.get("unknown_trip_counts"):
      lines.append(f"While loops of unknown trip count (counted once): "
                   f"{', '.join(report['unknown_trip_counts'])}.")
    lines += ["", f"Top {TOP} launch families (name without its number, per category) by "
                  "floor:", "",
              "| family | category | launches | GFLOP | GB | floor ms |",
              "|---|---|---:|---:|---:|---:|"]
    for t in report["top"]:
      lines.append(f"| `{t['name']}` | {t['category']} | {t['launches']:,} | "
                   f"{_fmt(t['flops'] / 1e9, 1)} | {_fmt(t['bytes'] / 1e9)} | "
                   f"{_fmt(t['floor_ms'])} |")
  else:
    lines += [f"{report['steps']} traced steps after {report['warmup']} warm-up and "
              f"{report['steps']} timed ones.", "",
              "| category | kernels/step | ms/step | share |", "|---|---:|---:|---:|"]
    for c in report["categories"]:
      lines.append(f"| {c['label']} | {_fmt(c['kernels'], 0)} | {_fmt(c['ms'])} | "
                   f"{c['share']:.1%} |")
    over = total["device_over_wall"]
    lines += [f"| **kernels' sum** | {_fmt(total['kernels'], 0)} | {_fmt(total['ms'])} | 100% |",
              "", f"Measured step (wall, untraced): {_fmt(total['wall_ms'])} ms; the kernels' "
                  f"sum is {'n/a' if over is None else f'{over:.0%}'} of it.", "",
              f"Top {TOP} kernels by name; a launch's floor, shapes and GEMM tiles are its "
              "first HLO op's (x floor: ms/step over calls/step times that floor):", "",
              "| kernel | category | calls/step | ms/step | share | floor ms/launch | x floor "
              "| shapes | tiles | HLO ops |",
              "|---|---|---:|---:|---:|---:|---:|---|---|---|"]
    for t in report["top"]:
      launch = t.get("launch") or {}
      floor = launch.get("floor_ms")
      over = t["ms"] / (t["calls"] * floor) if floor and t["calls"] else None
      lines.append(f"| `{t['name'][:80]}` | {t['category']} | {_fmt(t['calls'], 0)} | "
                   f"{_fmt(t['ms'], 3)} | {t['share']:.1%} | "
                   f"{'-' if floor is None else _fmt(floor, 4)} | "
                   f"{'-' if over is None else _fmt(over, 1)} | {launch.get('shapes', '')} | "
                   f"{launch.get('tiles', '')} | {', '.join(t['hlo_ops'])} |")
    idle = report.get("idle")
    if idle:
      lines += ["", f"Idle between the kernels: {_fmt(idle['ms'])} ms/step in "
                    f"{_fmt(idle['gaps'], 0)} gaps; the largest: " + "; ".join(
                        f"{_fmt(g['ms'], 3)} ms after `{g['after'][:60]}` before "
                        f"`{g['before'][:60]}`" for g in idle["largest"]) + "."]
  return "\n".join(lines) + "\n"


def write(report: dict, out_dir: str) -> list[pathlib.Path]:
  """`step_profile_<model>_<where>.json` and `.md` in `out_dir`."""
  out = pathlib.Path(out_dir)
  out.mkdir(parents=True, exist_ok=True)
  where = (f"{report['target']}_deviceless" if report["mode"] == "deviceless"
           else re.sub(r"\W+", "_", report["device_kind"].lower()).strip("_"))
  stem = out / f"step_profile_{report['model']}_{where}"
  paths = [stem.with_suffix(".json"), stem.with_suffix(".md")]
  paths[0].write_text(json.dumps(report, indent=1) + "\n")
  paths[1].write_text(markdown(report))
  return paths


# The command line.

def _flags(argv: list[str]):

  values = flags.FlagValues()
  argv = config_names.resolve_argv(argv)
  config_flags.DEFINE_config_file("config", config_names.packaged_path("default"),
                                  "Experiment config: NAME[:ARG] or FILE[:ARG].",
                                  flag_values=values, lock_config=False,
                                  accept_new_attributes=True, sys_argv=argv)
  flags.DEFINE_string("deviceless", None, "Compile for this target (h100, h200, a100) on this "
                      "machine and give each category's roofline floor.", flag_values=values)
  flags.DEFINE_bool("device", False, "Trace steps on this machine's device (the default when "
                    "it is a GPU; on a CPU it checks the tool).", flag_values=values)
  flags.DEFINE_integer("steps", 5, "Timed steps, then as many traced ones.", flag_values=values)
  flags.DEFINE_integer("warmup", 2, "Steps before timing.", flag_values=values)
  flags.DEFINE_string("out", None, "Folder for the JSON and Markdown.", flag_values=values)
  flags.DEFINE_string("name", None, "The model's name in the report and its file names "
                      "(default: from --config; give one to a config with overrides).",
                      flag_values=values)
  flags.DEFINE_string("save_hlo", None, "--deviceless: also write the compiled program's HLO "
                      "text here.", flag_values=values)
  flags.DEFINE_string("load_hlo", None, "--deviceless: read the program from this HLO text "
                      "(a --save_hlo file) instead of compiling.", flag_values=values)
  values(argv)
  return values


def main(argv: list[str] | None = None) -> dict:
  argv = list(sys.argv if argv is None else ["step_profile", *argv])
  values = _flags(argv)
  target = targets.parse_target(values.deviceless) if values.deviceless else None
  if target is not None:
    targets.require_compiler(target)
    targets.use_cpu_backend()
  config = values.config
  switch_kinds(config, config_flags.get_override_values(values["config"]))
  config_path = config_names.short_name(values["config"].config_filename)
  meta = {"model": values.name or model_name(config_path), "config": config_path,
          "dtype": config.model.get("dtype", "float32"),
          "batch_size": config.data.batch_size, "seq_len": config.data.seq_len,
          "command": " ".join(["python -m benchmarks.step_profile", *argv[1:]]),
          "machine": machine.machine_info()}
  if target is not None:
    started = time.perf_counter()
    step_memory = None
    if values.load_hlo:
      text, options = pathlib.Path(values.load_hlo).read_text(), {"loaded_from": values.load_hlo}
    else:
      compiled, options = compile_step(task_for(config), target)
      text, step_memory = compiled.as_text(), memory.MemoryUse.of(compiled)
    if values.save_hlo:
      pathlib.Path(values.save_hlo).write_text(text)
    peaks = roofline.device_peaks(target.description)
    if peaks is None:
      sys.exit(f"step_profile: no peaks for {target.description} in benchmarks/roofline.py")
    report = {**meta, "target": target.name, "xla_options": options,
              "compile_s": time.perf_counter() - started,
              "memory": step_memory and {"temporary_bytes": step_memory.temporary,
                                         "total_bytes": step_memory.total},
              **deviceless_report(text, peaks)}
  else:
    if values.load_hlo or values.save_hlo:
      sys.exit("step_profile: --load_hlo and --save_hlo go with --deviceless")
    if jax.default_backend() != "gpu" and not values.device:
      sys.exit("step_profile: no GPU here; --deviceless=h100 gives the compiled program's "
               "floors, --device traces this machine's CPU (a check of the tool)")
    report = {**meta, **profile_on_device(config, values.steps, values.warmup)}
  print(markdown(report))
  if values.out:
    for path in write(report, values.out):
      print(f"wrote {path}", file=sys.stderr)
  return report


def profile_on_device(config, steps: int, warmup: int) -> dict:
  """`device_report` of the config's step on one device, on random tokens."""
  train_step = LMTrainStep(config, parallel.make_mesh([1, 1, 1]))
  batch = train_step.random_batch(np.random.default_rng(0))
  return device_report(train_step, batch, steps=steps, warmup=warmup)


if __name__ == "__main__":
  # What training compiles, even where the environment asks for fast unoptimised compiles
  # (JAX_DISABLE_MOST_OPTIMIZATIONS, as the test suite sets).
  jax.config.update("jax_disable_most_optimizations", False)
  main()
