"""SIGTERM/SIGINT handling: finish the current step, save, then exit cleanly."""

import signal
import threading

from absl import logging


class StopRequest:
  """Context manager that turns SIGTERM and SIGINT into a flag the training loop polls."""

  def __init__(self):
    self._event = threading.Event()
    self._previous = {}

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
    return self._event.is_set()
