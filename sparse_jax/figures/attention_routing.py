"""Which experts each SwitchHead head chooses: V and O expert usage per head in one layer.

SwitchHead attention (`model.attention` "switchhead" or "switchhead_xl",
`layers.switchhead_attention`) routes each head's value and output projections to K of its E
experts. The layer's `apply_with_aux` returns, per call, `v_token_share` and `o_token_share`
`[H, E]`: the fraction of the call's tokens that each head sends to each expert (each head's
row sums to K; for `switchhead_xl` the V shares count the segment's tokens, not the memory's).
The decoder block passes them up, and the LM returns them as
`aux["layer{i}/attn_v/token_share"]` and `aux["layer{i}/attn_o/token_share"]` for the layer at
depth i (a MoEUT layer shared by several depths is counted at each depth separately).

Here the restored model runs over a split (`recording.run_language_model`, as the other run
figures do); the LM's aux of every forward is recorded and the shares of layer `layer` are
averaged over the calls, weighted by their tokens. The figure: for V and for O, a heads x
experts heatmap of usage whose colour scale is centred on the uniform share K/E (white: the
expert gets its even share; red: more; blue: less).
"""

import numpy as np
from matplotlib import colors

from sparse_jax.figures import output, recording
from sparse_jax.models.lm import TransformerLM
from sparse_jax.models.lm_config import SWITCHHEAD_KINDS
from sparse_jax.tasks import runs

ROUTERS = ("v", "o")


def _shares(layer: int):
  """A `recording` record of one `TransformerLM` call: (tokens, {router: share [H, E]})."""

  def record(model: TransformerLM, args: tuple, outputs) -> tuple[int, dict]:
    del model
    aux = outputs[2]
    return int(np.asarray(args[0]).size), {
        router: np.asarray(aux[f"layer{layer}/attn_{router}/token_share"], np.float64)
        for router in ROUTERS}

  return record


def compute_attention_routing(workdir: str, *, layer: int = 0, step: int | None = None,
                              splits: tuple[str, ...] = ("validation",),
                              max_batches: int | None = 8) -> dict:
  """Usage `[H, E]` of the V and the O experts of each head in layer `layer` (0-based depth)
  of the SwitchHead LM saved in `workdir` (checkpoint `step`, default the latest): the
  fraction of the tokens of `splits` for which the head picks each expert."""
  step, config = runs.saved_config(workdir, step)
  attention = config.get("model", {}).get("attention")
  if attention not in SWITCHHEAD_KINDS:
    raise ValueError(f"attention routing needs SwitchHead attention (model.attention one of "
                     f"{SWITCHHEAD_KINDS}); {workdir} has model.attention={attention!r}.")
  model, config = runs.load(workdir, step)
  if not 0 <= layer < model.n_layers:
    raise ValueError(f"layer must be in [0, {model.n_layers - 1}] (the model's layers); "
                     f"got {layer}.")
  with recording.recording(model, TransformerLM, _shares(layer)) as records:
    n_tokens = recording.run_language_model(model, config, splits, max_batches)
  (calls,) = records.values()
  weights = np.array([tokens for tokens, _ in calls], np.float64)
  usage = {router: np.tensordot(weights, np.stack([shares[router] for _, shares in calls]), 1)
           / weights.sum() for router in ROUTERS}
  n_heads, n_experts = usage["v"].shape
  k = config.model.attention_k
  return {"workdir": workdir, "step": step, "splits": list(splits), "tokens": n_tokens,
          "attention": attention, "layer": layer, "n_layers": model.n_layers,
          "n_heads": n_heads, "n_experts": n_experts, "k": k, "uniform": k / n_experts,
          **{f"{router}_usage": usage[router].tolist() for router in ROUTERS}}


def plot_attention_routing(numbers: dict):
  fig, axes = output.new_figure(2)
  uniform = numbers["uniform"]
  # Centred on K/E: white is the even share. With K = E every expert is always used (1.0).
  norm = (colors.TwoSlopeNorm(vcenter=uniform, vmin=0.0, vmax=1.0) if uniform < 1
          else colors.Normalize(vmin=0.0, vmax=1.0))
  heads, experts = np.arange(numbers["n_heads"]), np.arange(numbers["n_experts"])
  for ax, router, title in zip(axes, ROUTERS, ("V (value) experts", "O (output) experts")):
    usage = np.array(numbers[f"{router}_usage"])
    image = ax.imshow(usage, aspect="auto", cmap="RdBu_r", norm=norm)
    if usage.size <= 64:  # the numbers in the cells, while they fit
      for h in heads:
        for e in experts:
          ax.text(e, h, f"{usage[h, e]:.2f}", ha="center", va="center", fontsize=7)
    ax.set_title(f"{title}, layer {numbers['layer'] + 1}")
    ax.set_xlabel("expert")
    ax.set_xticks(experts)
    ax.set_ylabel("head")
    ax.set_yticks(heads)
    bar = fig.colorbar(image, ax=ax, label="fraction of tokens")
    bar.ax.axhline(uniform, color="black", linewidth=1.5)
    ticks = sorted({0.0, uniform, 1.0})
    bar.set_ticks(ticks, labels=[f"K/E = {t:.2g}" if t == uniform else f"{t:g}"
                                 for t in ticks])
  fig.suptitle(f"SwitchHead expert usage per head (K = {numbers['k']} of "
               f"E = {numbers['n_experts']}; uniform K/E = {uniform:.2g})")
  return fig


def make_attention_routing(workdir: str, out_dir: str, *, name: str = "attention_routing",
                           **kwargs) -> dict[str, str]:
  """Computes (`compute_attention_routing(workdir, **kwargs)`), plots and saves."""
  numbers = compute_attention_routing(workdir, **kwargs)
  return output.save(plot_attention_routing(numbers), numbers, out_dir, name)
