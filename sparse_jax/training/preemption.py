"""SIGTERM/SIGINT handling: finish the current step, save, then exit cleanly; in a
multi-process run, every process stops after the same step.

A signal sets a flag in the process it reaches only, and a preemption notice (SIGTERM) may
reach the processes of a multi-host job at different steps, or one of them alone. Were each
process to stop on its own flag, one would enter the checkpoint save (a collective) while
another takes a step (another collective): the job hangs or loses the save. So with several
processes the flags are agreed (`StopAgreement`) and every process stops after the same step,
saves it and reports the same interrupted result.
"""

import signal
import threading

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging
from jax.sharding import Mesh, NamedSharding, PartitionSpec


class StopAgreement:
  """Whether any process of a mesh has asked to stop: the processes' flags OR-ed on the
  devices by a tiny all-reduce that each process starts after every step and reads one step
  later.

  Read one step late, the reduction has run behind the step before, so it adds no device sync
  that holds up the devices (the host still dispatches one step ahead of them); and every
  process reads the result of the same reduction after the same step, so all stop after that
  step and save it. Polled every step, the run stops one step later than a single process
  would (a signal during step k stops it after step k + 1), whatever `train.log_every` is.

  Why not JAX's preemption service (`multihost_utils.reached_preemption_sync_point`, behind
  Orbax's `CheckpointManager.reached_preemption`), which `jax.distributed.initialize` starts
  by default (`jax_enable_preemption_service`): it hears SIGTERM through a C++ signal handler
  that any Python handler of SIGTERM replaces (and ours is needed for one process and for
  SIGINT); its step counter is also set by Orbax's own calls, in its save and in its
  finalize thread; and a notice received before a resumed run's first step sets the sync
  point to step 1, which that run never reaches, so the notice is lost.
  """

  def __init__(self, mesh: Mesh):
    # One flag per device of the mesh: each process fills its devices' entries.
    self._flags = NamedSharding(mesh, PartitionSpec(mesh.axis_names))
    self._any = jax.jit(jnp.max, out_shardings=NamedSharding(mesh, PartitionSpec()))
    self._pending: jax.Array | None = None

  def poll(self, requested: bool) -> bool:
    """Starts the reduction of every process's `requested` and returns the previous call's
    result (False on the first call). Every process must call it equally often."""
    local = np.array([requested], np.int32)
    flags = jax.make_array_from_callback((self._flags.mesh.size,), self._flags,
                                         lambda _: local)
    previous, self._pending = self._pending, self._any(flags)
    return previous is not None and bool(previous.addressable_data(0))


class StopRequest:
  """Context manager that turns SIGTERM and SIGINT into a flag the training loop polls
  (`should_stop`).

  `mesh`: the run's mesh. When it spans several processes, `should_stop` returns their
  agreement (`StopAgreement`), not this process's flag.
  """

  def __init__(self, mesh: Mesh | None = None):
    self._event = threading.Event()
    self._previous = {}
    self._agreement = (StopAgreement(mesh) if mesh is not None and jax.process_count() > 1
                       else None)

  def __enter__(self) -> "StopRequest":
    if threading.current_thread() is threading.main_thread():
      for sig in (signal.SIGTERM, signal.SIGINT):
        self._previous[sig] = signal.signal(sig, self._handle)
    return self

  def __exit__(self, *exc) -> None:
    for sig, handler in self._previous.items():
      signal.signal(sig, handler)

  def _handle(self, signum, frame) -> None:
    del frame
    logging.warning("Received %s: saving a checkpoint before exiting.",
                    signal.Signals(signum).name)
    self._event.set()

  @property
  def requested(self) -> bool:
    """Whether a signal has reached this process."""
    return self._event.is_set()

  def should_stop(self) -> bool:
    """Whether the loop stops now (call once before the first step and once after each).

    One process: `requested`, with no device sync. Several: whether any process had been
    signalled by the previous call, the same answer on every process (`StopAgreement`).
    """
    if self._agreement is None:
      return self.requested
    return self._agreement.poll(self.requested)
