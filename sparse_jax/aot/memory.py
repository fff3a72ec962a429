"""What a compiled program needs of one device's memory, and whether that fits.

XLA's buffer assignment (`compiled.memory_analysis()`, per device for a program split over a
mesh) counts the arguments, the outputs, the outputs that reuse a donated argument's buffer
(aliased), the temporaries and, on TPU, the program itself. The memory the program needs
while it runs is their sum less the aliased bytes: exact for XLA's own allocations, not for
what a runtime adds (cuDNN/cuBLAS workspaces, collectives' buffers, fragmentation).
"""

import dataclasses

GIB = 2**30
# JAX's GPU client takes 75% of the device's memory for its pool unless told otherwise.
JAX_GPU_POOL_FRACTION = 0.75


@dataclasses.dataclass(frozen=True)
class MemoryUse:
  """Bytes per device of one compiled program (module docstring)."""

  arguments: int
  outputs: int
  aliased: int
  temporary: int
  code: int

  @classmethod
  def of(cls, compiled) -> "MemoryUse":
    """From a `jax.stages.Compiled`."""
    stats = compiled.memory_analysis()
    return cls(arguments=stats.argument_size_in_bytes, outputs=stats.output_size_in_bytes,
               aliased=stats.alias_size_in_bytes, temporary=stats.temp_size_in_bytes,
               code=stats.generated_code_size_in_bytes)

  @property
  def total(self) -> int:
    return self.arguments + self.outputs - self.aliased + self.temporary + self.code


def verdict(total: int, device_bytes: int) -> str:
  """`fits (X GB free)` or `does not fit by X GB`."""
  if total <= device_bytes:
    return f"fits ({(device_bytes - total) / GIB:.2f} GiB free)"
  return f"does not fit by {(total - device_bytes) / GIB:.2f} GiB"


def format_use(name: str, use: MemoryUse) -> str:
  """One line: the parts and the total in GiB."""
  return (f"{name}: arguments {use.arguments / GIB:.3f} GiB, outputs {use.outputs / GIB:.3f}"
          f" GiB (of which aliased to arguments {use.aliased / GIB:.3f}), temporaries "
          f"{use.temporary / GIB:.3f} GiB, code {use.code / GIB:.3f} GiB; total "
          f"{use.total / GIB:.3f} GiB")
