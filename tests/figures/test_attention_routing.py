"""`figures.py attention_experts`: the V and O expert usage per head of one SwitchHead layer,
on tiny runs trained here.

The numbers are checked against an independent tap: pytest's `monkeypatch` wraps the layer's
`apply_with_aux` to keep each call's `v_selection` / `o_selection` `[B, T, H, K]`, and the
tokens choosing each (head, expert) are recounted with Python loops.
"""

import json

import numpy as np
import pytest
from lm_testing import tiny_lm_config

from sparse_jax.cli import figures
from sparse_jax.figures import attention_routing
from sparse_jax.layers.switchhead_attention import SwitchHeadAttention
from sparse_jax.tasks import train_and_evaluate

MAX_BATCHES = 3
E, K = 4, 2


def _train(root, stdlib_slice, **model):
  config = tiny_lm_config(stdlib_slice, str(root / "tfds"))
  config.train.update(steps=2, warmup_steps=1, ckpt_every=2, log_every=2)
  config.eval.max_batches = 1  # the final evaluation: not what is tested here
  config.model.update(model)
  train_and_evaluate(config, str(root / "run"))
  return str(root / "run"), config


@pytest.fixture(scope="module")
def switchhead_run(tmp_path_factory, stdlib_slice):
  return _train(tmp_path_factory.mktemp("switchhead"), stdlib_slice, attention="switchhead",
                attention_experts=E, attention_k=K)


def _recount(selections: list[np.ndarray], n_heads: int) -> np.ndarray:
  """`[H, E]`: per head, the fraction of tokens whose K choices include each expert."""
  counts, n_tokens = np.zeros((n_heads, E)), 0
  for sel_bthk in selections:
    for token in sel_bthk.reshape(-1, n_heads, K).tolist():
      n_tokens += 1
      for h, chosen in enumerate(token):
        for e in range(E):
          counts[h, e] += e in chosen
  return counts / n_tokens


def test_usage_per_head_is_the_recount_of_the_layers_selections(switchhead_run, tmp_path,
                                                                monkeypatch):
  workdir, config = switchhead_run
  calls = []  # per call: (layer object id, v_selection, o_selection)
  real_apply = SwitchHeadAttention.apply_with_aux

  def keep_selections(self, *args, **kwargs):
    y, aux = real_apply(self, *args, **kwargs)
    calls.append((id(self), np.asarray(aux["v_selection"]), np.asarray(aux["o_selection"])))
    return y, aux

  with monkeypatch.context() as m:
    m.setattr(SwitchHeadAttention, "apply_with_aux", keep_selections)
    paths = attention_routing.make_attention_routing(
        workdir, str(tmp_path), layer=1, splits=("validation",), max_batches=MAX_BATCHES)
  numbers = json.loads(open(paths["json"]).read())
  with open(paths["png"], "rb") as f:
    assert f.read(8) == b"\x89PNG\r\n\x1a\n"

  n_heads = config.model.n_heads
  assert numbers["tokens"] == MAX_BATCHES * config.eval.batch_size * config.data.seq_len
  assert (numbers["attention"], numbers["layer"], numbers["step"]) == ("switchhead", 1, 2)
  assert (numbers["n_heads"], numbers["n_experts"], numbers["k"]) == (n_heads, E, K)
  assert numbers["uniform"] == K / E
  layer_ids = list(dict.fromkeys(layer_id for layer_id, _, _ in calls))  # in depth order
  assert len(layer_ids) == config.model.n_layers
  mine = [call for call in calls if call[0] == layer_ids[1]]
  assert len(mine) == MAX_BATCHES
  for router, index in (("v", 1), ("o", 2)):
    usage = np.array(numbers[f"{router}_usage"])
    expected = _recount([call[index] for call in mine], n_heads)
    np.testing.assert_allclose(usage, expected, rtol=0, atol=1e-12)
    np.testing.assert_allclose(usage.sum(axis=1), K, rtol=1e-12)  # K experts per head, token


def test_the_cli_writes_the_figure(switchhead_run, tmp_path, capsys):
  workdir, _ = switchhead_run
  figures.main(["attention_experts", workdir, "--layer", "0", "--step", "2", "--max_batches",
                "1", "--out", str(tmp_path), "--name", "sh"])
  assert "wrote" in capsys.readouterr().out
  numbers = json.loads((tmp_path / "sh.json").read_text())
  assert numbers["layer"] == 0 and len(numbers["o_usage"]) == 2
  assert (tmp_path / "sh.png").stat().st_size > 0


def test_refuses_a_run_without_switchhead_attention(stdlib_slice, tmp_path):
  workdir, _ = _train(tmp_path, stdlib_slice)  # the tiny default: XL attention, sigma-MoE FF
  message = (r"SwitchHead attention \(model.attention one of \('switchhead', "
             r"'switchhead_xl'\)\); .* has model.attention='xl'")
  with pytest.raises(ValueError, match=message):
    attention_routing.compute_attention_routing(workdir, max_batches=1)
  with pytest.raises(SystemExit, match="figures.py attention_experts: attention routing"):
    figures.main(["attention_experts", workdir, "--out", str(tmp_path / "figs")])


def test_refuses_a_layer_outside_the_model(switchhead_run):
  with pytest.raises(ValueError, match=r"layer must be in \[0, 1\]"):
    attention_routing.compute_attention_routing(switchhead_run[0], layer=2, max_batches=1)
