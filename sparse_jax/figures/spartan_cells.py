"""Which parent cells the examples of each class pick in the last SPARTAN memory (SPARTAN
Fig. 2).

The paper trains SPARTAN with 5 parents of one child each on BBC news and plots, per parent,
the ground-truth labels of the instances that pick it (App. D). Here, for any classification
run with a SPARTAN memory: every position the classifier reads (the first, `<s>`, for an
encoder backbone; every real token for a language-model backbone, which is mean-pooled) picks
its top-K parents in the last layer (`spartan.select_parents`); `counts[p][c]` is how many such
picks of parent p come from examples of class c, and `share[p]` that row as a distribution.
"""

import numpy as np

from sparse_jax.figures import output, recording
from sparse_jax.layers import spartan
from sparse_jax.layers.spartan import SpartanMemory
from sparse_jax.tasks import runs
from sparse_jax.tasks import ClassificationTask, task_for


def _parents(memory: SpartanMemory, args: tuple, _) -> np.ndarray:
  """`[B, T, K]` parent ids each position of the call's `x [B, T, d]` picks."""
  x_btd = args[0]
  _, ids_nk = spartan.select_parents(x_btd.reshape(-1, memory.d_model),
                                     memory.parents[...].astype(x_btd.dtype), memory.top_k)
  return np.asarray(ids_nk).reshape(*x_btd.shape[:-1], memory.top_k)


def pick_counts(ids_btk: np.ndarray, read_bt: np.ndarray, labels_b: np.ndarray,
                n_parents: int, n_classes: int) -> np.ndarray:
  """`[P, C]` picks of each parent by the read positions (`read_bt`) of each class."""
  counts_pc = np.zeros((n_parents, n_classes), np.int64)
  labels_btk = np.broadcast_to(labels_b[:, None, None], ids_btk.shape)
  read_btk = np.broadcast_to(read_bt[..., None], ids_btk.shape)
  np.add.at(counts_pc, (ids_btk[read_btk], labels_btk[read_btk]), 1)
  return counts_pc


def compute_spartan_cells(workdir: str, *, split: str = "validation",
                          max_examples: int | None = 512, step: int | None = None) -> dict:
  """Picks of each parent of the last SPARTAN layer by class (module docstring) over the
  first `max_examples` examples of `split`, for the fine-tuning run saved in `workdir`."""
  model, config = runs.load(workdir, step)
  task = task_for(config)
  memories = recording.modules_of_type(model, SpartanMemory)
  if not isinstance(task, ClassificationTask) or not memories:
    raise ValueError(f"parent cells need a classification run with a SPARTAN memory "
                     f"(method.kind='spartan'); {workdir} is not one.")
  if task.spec.num_classes < 2:
    raise ValueError(f"parent cells need class labels; {task.spec.name} is a regression.")
  arrays = task.tokenized(split, max_examples)
  batch = task.typed.eval.batch_size
  with recording.recording(model, SpartanMemory, _parents) as records:
    for start in range(0, len(arrays["labels"]), batch):
      model(arrays["tokens"][start:start + batch], arrays["lengths"][start:start + batch])
  last = recording.in_depth_order(records)[-1]
  ids_btk = np.concatenate(records[last])
  positions_bt = np.arange(ids_btk.shape[1])[None, :]
  read_bt = (positions_bt == 0 if model.pool_first
             else positions_bt < arrays["lengths"][:, None])
  read_bt = np.broadcast_to(read_bt, ids_btk.shape[:2])
  counts_pc = pick_counts(ids_btk, read_bt, np.asarray(arrays["labels"]),
                          memories[last].n_parents, task.spec.num_classes)
  totals_p1 = counts_pc.sum(axis=1, keepdims=True)
  share_pc = np.divide(counts_pc, totals_p1, out=np.zeros(counts_pc.shape), where=totals_p1 > 0)
  return {"workdir": workdir, "split": split, "examples": int(len(arrays["labels"])),
          "layer": last, "counts": counts_pc.tolist(), "share": share_pc.tolist()}


def plot_spartan_cells(numbers: dict):
  fig, (ax,) = output.new_figure()
  share_pc = np.array(numbers["share"])
  parents = np.arange(1, share_pc.shape[0] + 1)
  bottom = np.zeros(len(parents))
  for c in range(share_pc.shape[1]):
    ax.bar(parents, share_pc[:, c], bottom=bottom, label=f"class {c}")
    bottom += share_pc[:, c]
  ax.set_xlabel(f"parent cell ({numbers['layer']})")
  ax.set_ylabel("share of picks by class")
  ax.set_xticks(parents)
  ax.legend(fontsize="small")
  return fig


def make_spartan_cells(workdir: str, out_dir: str, *, name: str = "spartan_cells",
                       **kwargs) -> dict[str, str]:
  """Computes (`compute_spartan_cells(workdir, **kwargs)`), plots and saves."""
  numbers = compute_spartan_cells(workdir, **kwargs)
  return output.save(plot_spartan_cells(numbers), numbers, out_dir, name)
