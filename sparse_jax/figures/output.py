"""Writing a figure: the PNG and the numbers behind it, side by side."""

import json
import os

import matplotlib

matplotlib.use("Agg")  # Files only: no display is needed (servers, CI, notebooks alike).
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the backend)


def new_figure(n_panels: int = 1, *, width: float = 5.0, height: float = 3.6):
  """A figure with `n_panels` axes side by side; returns (figure, [axes])."""
  fig, axes = plt.subplots(1, n_panels, figsize=(width * n_panels, height), squeeze=False)
  return fig, list(axes[0])


def save(fig, numbers: dict, out_dir: str, name: str) -> dict[str, str]:
  """Writes `out_dir/name.png` and `out_dir/name.json` (the numbers); closes the figure.

  Returns {"png": path, "json": path}.
  """
  os.makedirs(out_dir, exist_ok=True)
  paths = {"png": os.path.join(out_dir, f"{name}.png"),
           "json": os.path.join(out_dir, f"{name}.json")}
  fig.tight_layout()
  fig.savefig(paths["png"], dpi=120)
  plt.close(fig)
  with open(paths["json"], "w") as f:
    json.dump(numbers, f, indent=1)
  return paths
