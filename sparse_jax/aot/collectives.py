"""The collectives of a compiled program: what each device sends, read from its HLO text.

Sharding is a promise about communication: a tensor-parallel layer should all-reduce its
activations (Megatron: two all-reduces of `B x T x d` per layer forward, two backward) and
never all-gather a whole weight. XLA's partitioner decides what it emits, so the compiled
program (`jax.jit(f).lower(...).compile().as_text()`) is where to count it: every
`all-reduce`, `all-gather`, `reduce-scatter`, `all-to-all` and `collective-permute`
(synchronous or `-start`), with the arrays it carries, the size of its device groups, whether
it belongs to the backward pass (JAX names those ops `transpose(...)`) and whether it runs
inside a loop (a `while` body, once per iteration: a data-dependent count the text does not
give). XLA combines independent all-reduces into one op over a tuple; each array of the tuple
is counted as its own collective, named by its part of the op's name. An op whose groups are
single devices moves nothing and is left out.
"""

import dataclasses
import math
import re

KINDS = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")
_ITEMSIZE = {"pred": 1, "s8": 1, "u8": 1, "bf16": 2, "f16": 2, "s16": 2, "u16": 2, "f32": 4,
             "s32": 4, "u32": 4, "f64": 8, "s64": 8, "u64": 8}

_COMPUTATION = re.compile(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$")
_INSTRUCTION = re.compile(
    r"=\s*(?P<shape>\(.*?\)|[\w]+\[[\d,]*\](?:\{[^}]*\})?)\s+"
    r"(?P<kind>" + "|".join(KINDS) + r")(?:-start)?\(")
_ARRAY = re.compile(r"(\w+)\[([\d,]*)\]")
_OP_NAME = re.compile(r'op_name="([^"]*)"')
_WHILE_BODY = re.compile(r"\bwhile\(.*\bbody=%?([\w.\-]+)")
_MESH_GROUPS = re.compile(r"replica_groups=mesh\[([^\]]*)\]\s*\{([^}]*)\}")
_IOTA_GROUPS = re.compile(r"replica_groups=\[([\d,]+)\]<=")
_LIST_GROUPS = re.compile(r"replica_groups=\{\{([\d,]*)\}")


@dataclasses.dataclass(frozen=True)
class Collective:
  """One array moved by one collective op."""

  kind: str  # one of KINDS
  dtype: str
  shape: tuple[int, ...]
  group_size: int | None  # devices per group; None: all of them (`replica_groups={}`)
  backward: bool  # part of the backward pass (its op name has `transpose(`)
  in_loop: bool  # inside a `while` body: runs once per iteration
  op_name: str

  @property
  def nbytes(self) -> int:
    """Bytes of the array the op produces (all-reduce: the reduced array; all-gather: the
    gathered one; reduce-scatter: one device's part)."""
    return math.prod(self.shape) * _ITEMSIZE.get(self.dtype, 4)


def _group_size(line: str) -> int | None:
  mesh = _MESH_GROUPS.search(line)
  if mesh:
    sizes = dict(re.findall(r"'(\w+)'=(\d+)", mesh.group(1)))
    return math.prod(int(sizes[axis]) for axis in re.findall(r"'(\w+)'", mesh.group(2)))
  iota = _IOTA_GROUPS.search(line)
  if iota:
    return int(iota.group(1).split(",")[-1])
  listed = _LIST_GROUPS.search(line)
  return len(listed.group(1).split(",")) if listed else None


def _part_names(op_name: str, n_parts: int) -> list[str]:
  """The op name of each array of a combined op, `prefix/(a:b:c)` -> `[a, b, c]`."""
  prefix, _, rest = op_name.partition("/(")
  parts = rest[:-1].split(":") if rest.endswith(")") else []
  if len(parts) != n_parts:
    return [op_name] * n_parts
  return [f"{prefix}/{part}" for part in parts]


def _loop_bodies(hlo: str) -> set[str]:
  return set(_WHILE_BODY.findall(hlo))


def collectives(hlo: str) -> list[Collective]:
  """Every array every collective of the compiled HLO text `hlo` moves, in program order."""
  bodies, computation, found = _loop_bodies(hlo), None, []
  for line in hlo.splitlines():
    header = _COMPUTATION.match(line)
    if header and "=" not in line.split("{")[0]:
      computation = header.group(1)
      continue
    match = _INSTRUCTION.search(line)
    if not match:
      continue
    arrays = _ARRAY.findall(match.group("shape"))
    if match.group("shape").startswith("(") and line.find("-start(") > 0:
      arrays = arrays[len(arrays) // 2:]  # An async start's tuple: (operands, results).
    op_name = _OP_NAME.search(line)
    names = _part_names(op_name.group(1) if op_name else "", len(arrays))
    group = _group_size(line)
    if group == 1:
      continue
    for (dtype, dims), name in zip(arrays, names):
      found.append(Collective(
          kind=match.group("kind"), dtype=dtype,
          shape=tuple(int(d) for d in dims.split(",") if d), group_size=group,
          backward="transpose(" in name, in_loop=computation in bodies, op_name=name))
  return found
