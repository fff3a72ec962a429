"""Joining a multi-process (multi-host) job, before JAX touches any device.

Each process runs the same `train.py`; `jax.distributed.initialize` connects them through a
coordinator (process 0's address), after which `jax.devices()` lists every process's devices
and the mesh spans them all.

JAX's preemption service is turned off before joining: it installs a C++ SIGTERM handler that
would swallow a SIGTERM arriving before or after the training loop (the run would carry on),
and inside the loop `training.preemption` agrees on the stop step itself. Orbax treats a
disabled service as "no preemption reached".
"""

import jax

from sparse_jax import validation


def _without_preemption_service() -> None:
  if "jax_enable_preemption_service" in jax.config.values:
    jax.config.update("jax_enable_preemption_service", False)


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
      _without_preemption_service()
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
  _without_preemption_service()
  jax.distributed.initialize(coordinator_address=coordinator_address,
                             num_processes=num_processes, process_id=process_id)
  return True
