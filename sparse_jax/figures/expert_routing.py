"""Which experts tokens choose: usage per layer and co-occurrence in one layer of a MoE LM
(sigma-MoE paper Fig. 5).

Every MoE layer's router (`Routing.sel_nk`, `[N, K]` expert ids per token, slots with a zero
gate left out as `usage_counts` does) is recorded while the restored model runs over a split.
Usage: the fraction of tokens that use each expert, per layer (each row sums to K when every
slot is active). Co-occurrence in layer `layer`: `C[i, j]` counts the tokens that use experts
i and j together (i != j); each row is normalised to a distribution, as in Fig. 5 ("each row
shows the distribution of experts used together with the one corresponding to the row").
"""

import numpy as np

from sparse_jax.figures import output, recording
from sparse_jax.layers.routers.routing import Router
from sparse_jax.tasks import runs


def _chosen(router: Router, args: tuple, routing) -> np.ndarray:
  """`[N, E]` bool: which experts each of the call's N tokens uses."""
  del args
  sel_nk, active_nk = np.asarray(routing.sel_nk), np.asarray(routing.gates_nk) != 0
  chosen_ne = np.zeros((sel_nk.shape[0], router.n_experts), bool)
  rows_nk = np.broadcast_to(np.arange(sel_nk.shape[0])[:, None], sel_nk.shape)
  chosen_ne[rows_nk[active_nk], sel_nk[active_nk]] = True
  return chosen_ne


def cooccurrence(chosen_ne: np.ndarray) -> np.ndarray:
  """`[E, E]` row-normalised counts of tokens using experts i and j together (i != j); a row
  of an expert never used with another is all zero."""
  counts_ee = chosen_ne.T.astype(np.int64) @ chosen_ne.astype(np.int64)
  np.fill_diagonal(counts_ee, 0)
  totals_e1 = counts_ee.sum(axis=1, keepdims=True)
  return np.divide(counts_ee, totals_e1, out=np.zeros(counts_ee.shape), where=totals_e1 > 0)


def compute_expert_routing(workdir: str, *, layer: int = 2, step: int | None = None,
                           splits: tuple[str, ...] = ("validation",),
                           max_batches: int | None = 8) -> dict:
  """Usage `[L, E]` of every MoE layer and the co-occurrence `[E, E]` of layer `layer`
  (0-based block index; the paper shows the 3rd layer) of the MoE LM saved in `workdir`."""
  model, config = runs.load(workdir, step)
  routers = recording.modules_of_type(model, Router)
  if not routers:
    raise ValueError(f"expert routing needs a mixture-of-experts model; {workdir} has "
                     f"model.ff.kind={config.model.ff.kind!r}.")
  with recording.recording(model, Router, _chosen) as records:
    n_tokens = recording.run_language_model(model, config, splits, max_batches)
  layers = recording.in_depth_order(records)
  chosen = [np.concatenate(records[path]) for path in layers]
  if not 0 <= layer < len(layers):
    raise ValueError(f"layer must be in [0, {len(layers) - 1}] (the model's MoE layers); "
                     f"got {layer}.")
  return {"workdir": workdir, "splits": list(splits), "tokens": n_tokens,
          "k": max(r.k for r in routers.values()), "layers": layers, "layer": layer,
          "usage": [c.mean(axis=0).tolist() for c in chosen],
          "cooccurrence": cooccurrence(chosen[layer]).tolist()}


def plot_expert_routing(numbers: dict):
  fig, (co_ax, usage_ax) = output.new_figure(2)
  experts = np.arange(len(numbers["cooccurrence"]))
  image = co_ax.imshow(np.array(numbers["cooccurrence"]), cmap="viridis")
  co_ax.set_xticks(experts)
  co_ax.set_yticks(experts)
  co_ax.set_title(f"co-occurrence, layer {numbers['layer'] + 1}")
  co_ax.set_xlabel("expert used together")
  co_ax.set_ylabel("expert")
  fig.colorbar(image, ax=co_ax)
  usage = np.array(numbers["usage"])
  image = usage_ax.imshow(usage, aspect="auto", cmap="magma")
  usage_ax.set_title(f"fraction of tokens using each expert (K = {numbers['k']})")
  usage_ax.set_xlabel("expert")
  usage_ax.set_xticks(experts)
  usage_ax.set_ylabel("layer")
  usage_ax.set_yticks(np.arange(len(usage)), [str(i + 1) for i in range(len(usage))])
  fig.colorbar(image, ax=usage_ax)
  return fig


def make_expert_routing(workdir: str, out_dir: str, *, name: str = "expert_routing",
                        **kwargs) -> dict[str, str]:
  """Computes (`compute_expert_routing(workdir, **kwargs)`), plots and saves."""
  numbers = compute_expert_routing(workdir, **kwargs)
  return output.save(plot_expert_routing(numbers), numbers, out_dir, name)
