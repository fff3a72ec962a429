"""Active channels of `u` per layer of a dense model (sigma-MoE paper Fig. 1, 3 and 4).

For every token and layer, the number of channels of the hidden units `u = ReLU(x W1 + b1)`
(`DenseFF.up`, `[d_ff]`) that are non-zero; the figure shows their mean and standard deviation
over all tokens fed, per layer. The paper counts the validation and test sets of its dense
baselines: below 200 of 2053 channels in every layer of its 47M WikiText-103 model.
"""

import numpy as np

from sparse_jax.figures import output, recording
from sparse_jax.layers.dense_ff import DenseFF
from sparse_jax.tasks import runs


def _active_counts(ff: DenseFF, args: tuple, _) -> np.ndarray:
  """`[tokens]` non-zero channels of `u` for one call's input `x [B, T, d_model]`."""
  u_btf = np.asarray(ff.up(args[0]))
  return np.count_nonzero(u_btf, axis=-1).reshape(-1)


def compute_channel_activity(workdir: str, *, step: int | None = None,
                             splits: tuple[str, ...] = ("validation", "test"),
                             max_batches: int | None = 8) -> dict:
  """Per layer (in depth order): mean and std over tokens of the active channels of `u`,
  with `d_ff` and the tokens counted, for the dense LM saved in `workdir`."""
  model, config = runs.load(workdir, step)
  if not recording.modules_of_type(model, DenseFF):
    raise ValueError(f"channel activity needs a dense feed-forward model "
                     f"(model.ff.kind 'dense' or 'topk'); {workdir} has "
                     f"model.ff.kind={config.model.ff.kind!r}.")
  with recording.recording(model, DenseFF, _active_counts) as records:
    n_tokens = recording.run_language_model(model, config, splits, max_batches)
  layers = recording.in_depth_order(records)
  counts = [np.concatenate(records[layer]) for layer in layers]
  return {"workdir": workdir, "splits": list(splits), "tokens": n_tokens,
          "d_ff": int(config.model.ff.d_ff), "layers": layers,
          "mean": [float(c.mean()) for c in counts], "std": [float(c.std()) for c in counts]}


def plot_channel_activity(numbers: dict):
  fig, (ax,) = output.new_figure()
  depth = np.arange(1, len(numbers["layers"]) + 1)
  ax.bar(depth, numbers["mean"], yerr=numbers["std"], capsize=3, color="tab:blue")
  ax.set_xlabel("layer")
  ax.set_ylabel(f"active channels in u (of d_ff = {numbers['d_ff']})")
  ax.set_xticks(depth)
  ax.set_title(f"{numbers['tokens']} tokens; mean and std over tokens")
  return fig


def make_channel_activity(workdir: str, out_dir: str, *, name: str = "channel_activity",
                          **kwargs) -> dict[str, str]:
  """Computes (`compute_channel_activity(workdir, **kwargs)`), plots and saves."""
  numbers = compute_channel_activity(workdir, **kwargs)
  return output.save(plot_channel_activity(numbers), numbers, out_dir, name)
