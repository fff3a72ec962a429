"""Runs `train.py` with faults injected into its checkpoint saves (tests/training/test_faults*).

  python tests/fault_injection.py train.py --workdir=W [train.py's flags]

runs the real `train.py` (as `__main__`) after patching Orbax where the environment asks:

  FAULT_SAVE_DELAY=S     every checkpoint step waits S seconds before it is committed (renamed
                         into place), so a SIGKILL sent from outside at a random moment often
                         lands inside a save.
  FAULT_KILL=POINT@STEP  SIGKILL this process at POINT of the save of step STEP:
                           item    one item of the step (the optimiser state) is written and about
                                   to be renamed into the step's temporary directory;
                           commit  every item is written, the step directory not yet renamed;
                           delete  an old step is being removed after step STEP was saved:
                                   half its files are gone.
  FAULT_MARKER=PATH      created just before FAULT_KILL fires; while it exists the kill is not
                         injected again, so the resumed run passes the same point.
  FAULT_FSIZE=STEP:BYTES from the save of step STEP on, no file this process writes may grow
                         beyond BYTES (RLIMIT_FSIZE, SIGXFSZ ignored): the OS fails those
                         writes with EFBIG, as a full disk fails them with ENOSPC.
  FAULT_SIGTERM=STEP     this process sends itself SIGTERM during training step STEP (0-based),
                         as a preemption notice that reaches one process of a job.
"""

import os
import resource
import runpy
import signal
import sys

from orbax.checkpoint._src.path import atomicity, deleter

from sparse_jax.training import checkpointing, loop


def _kill_once() -> None:
  marker = os.environ["FAULT_MARKER"]
  if os.path.exists(marker):
    return
  with open(marker, "w") as f:
    f.write(os.environ["FAULT_KILL"])
  os.kill(os.getpid(), signal.SIGKILL)


def _kill_spec() -> tuple[str, int] | None:
  spec = os.environ.get("FAULT_KILL")
  if not spec:
    return None
  point, step = spec.split("@")
  return point, int(step)


def _patch_commit(delay: float, kill: tuple[str, int] | None) -> None:
  """Orbax renames each item's, then the step's, temporary directory into place in
  `AtomicRenameTemporaryPath.finalize`; the step's directory is named after the step."""
  real = atomicity.AtomicRenameTemporaryPath.finalize

  async def finalize(self, *args, **kwargs):
    final = self.get_final()
    is_step = final.name.isdigit()
    if is_step and delay:
      await _sleep(delay)
    if kill and ((kill[0] == "commit" and is_step and final.name == str(kill[1])) or
                 (kill[0] == "item" and final.name == "opt_state" and
                  final.parent.name.startswith(f"{kill[1]}."))):
      _kill_once()
    return await real(self, *args, **kwargs)

  atomicity.AtomicRenameTemporaryPath.finalize = finalize


async def _sleep(seconds: float) -> None:
  import asyncio
  await asyncio.sleep(seconds)


def _patch_delete(kill_step: int) -> None:
  """Kills while removing an old step, once step `kill_step` has been saved."""
  real = deleter.StandardCheckpointDeleter.delete

  def delete(self, step):
    saved = [int(n) for n in os.listdir(self._directory) if n.isdigit()]
    if max(saved, default=-1) >= kill_step and not os.path.exists(os.environ["FAULT_MARKER"]):
      files = sorted(os.path.join(d, f) for d, _, fs in os.walk(self._directory / str(step))
                     for f in fs)
      for path in files[:len(files) // 2]:
        os.remove(path)
      _kill_once()
    return real(self, step)

  deleter.StandardCheckpointDeleter.delete = delete


def _patch_file_size(from_step: int, max_bytes: int) -> None:
  real = checkpointing.Checkpointer.save

  def save(self, step, **kwargs):
    if step >= from_step:
      self.wait()  # Earlier saves complete within the limit; this one does not.
      signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
      resource.setrlimit(resource.RLIMIT_FSIZE, (max_bytes, resource.RLIM_INFINITY))
    return real(self, step, **kwargs)

  checkpointing.Checkpointer.save = save


def _patch_sigterm(stop_index: int) -> None:
  """Wraps the compiled training step to signal this process during step `stop_index`."""
  real = loop.Run._compile_step

  def compile_step(self, batch, step):
    compiled = real(self, batch, step)

    def step_fn(state, carry, batch, step_index):
      if step_index == stop_index:
        os.kill(os.getpid(), signal.SIGTERM)
      return compiled(state, carry, batch, step_index)

    return step_fn

  loop.Run._compile_step = compile_step


def main() -> None:
  kill = _kill_spec()
  _patch_commit(float(os.environ.get("FAULT_SAVE_DELAY", "0")), kill)
  if kill and kill[0] == "delete":
    _patch_delete(kill[1])
  if os.environ.get("FAULT_FSIZE"):
    step, max_bytes = map(int, os.environ["FAULT_FSIZE"].split(":"))
    _patch_file_size(step, max_bytes)
  if os.environ.get("FAULT_SIGTERM"):
    _patch_sigterm(int(os.environ["FAULT_SIGTERM"]))
  script = sys.argv[1]
  sys.argv = sys.argv[1:]
  sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
  runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
  main()
