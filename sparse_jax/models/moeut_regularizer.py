"""MoEUT's router regulariser (Csordas et al. 2024, "MoEUT: Mixture-of-Experts Universal
Transformers", Sec. 2): for each router of a shared layer, the entropy of its mean selection
distribution, the mean taken per sequence over the time steps *and the repeats* of the layer,
maximised:

    L = -coef * mean_b H( mean_{t, r} softmax(logits[b, t, r]) )

(averaged over heads too for SwitchHead's per-head routers). The softmax only regularises: the
routers select with sigmoids. As in the authors' `entropy_reg` (`moeut/moeut.py`), the mean is
taken in log space. `model.moeut_ff_reg` (gamma, 0.01 in their runs) weights the FF routers,
`model.moeut_attention_reg` (delta, 0.001) the V and O routers of SwitchHead, each summed over
the layer groups. Unlike sigma-MoE's Eq. 20 (`layers.routers.routing.entropy_regularizer`,
over the whole batch) the mean is per sequence.
"""

import math

import jax
import jax.numpy as jnp

# The per-repeat logits each router kind leaves in a block's aux (`layer{i}/{key}`).
FF_KEYS = ("router_logits",)
ATTENTION_KEYS = ("attn_v/logits", "attn_o/logits")


def negative_sequence_entropy(logits_per_repeat: list[jax.Array]) -> jax.Array:
  """`-H` of the per-sequence mean of `softmax(logits)`, averaged over sequences (and heads).

  Args:
    logits_per_repeat: one `[B, T, ..., E]` array per repeat of the layer (`...`: heads).
  """
  logits_bxe = jnp.concatenate(logits_per_repeat, axis=1).astype(jnp.float32)
  logp_bxe = jax.nn.log_softmax(logits_bxe, axis=-1)
  log_mean_be = jax.nn.logsumexp(logp_bxe, axis=1) - math.log(logits_bxe.shape[1])
  return jnp.mean(jnp.sum(jnp.exp(log_mean_be) * log_mean_be, axis=-1))


def moeut_regularizer(aux: dict[str, jax.Array], n_layers: int, n_groups: int, *,
                      ff_coef: float, attention_coef: float) -> jax.Array:
  """The MoEUT loss term of a model whose layer `i` is group `i % n_groups` (ABAB...),
  from the logits in its per-layer aux `layer{i}/...` (module docstring)."""
  total = jnp.zeros((), jnp.float32)
  for coef, keys in ((ff_coef, FF_KEYS), (attention_coef, ATTENTION_KEYS)):
    if not coef:
      continue
    for group in range(n_groups):
      for key in keys:
        repeats = [aux[f"layer{i}/{key}"] for i in range(group, n_layers, n_groups)]
        total = total + coef * negative_sequence_entropy(repeats)
  return total
