"""Joining a multi-process (multi-host) job, before JAX touches any device.

Each process runs the same `train.py`; `jax.distributed.initialize` connects them through a
coordinator (process 0's address), after which `jax.devices()` lists every process's devices
and the mesh spans them all.
"""

import jax

from sparse_jax import validation


def initialize(coordinator_address: str | None = None, num_processes: int | None = None,
               process_id: int | None = None, *, auto: bool = False) -> bool:
  """Joins a job named by all three arguments, or (with `auto`) one JAX detects itself
  (SLURM, Open MPI, Kubernetes, Cloud TPU). Returns whether a job was joined.

  Raises `ConfigError` when only some of the three arguments are given.
  """
  named = {"coordinator_address": coordinator_address, "num_processes": num_processes,
           "process_id": process_id}
  if all(v is None for v in named.values()):
    if auto:
      jax.distributed.initialize()
    return auto
  missing = [name for name, v in named.items() if v is None]
  if missing:
    raise validation.ConfigError(
        f"a multi-process job needs --coordinator_address, --num_processes and --process_id; "
        f"missing {missing}.")
  if not 0 <= process_id < num_processes:
    raise validation.ConfigError(
        f"--process_id must be in [0, --num_processes={num_processes}); got {process_id}.")
  jax.distributed.initialize(coordinator_address=coordinator_address,
                             num_processes=num_processes, process_id=process_id)
  return True
