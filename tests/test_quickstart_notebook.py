"""`notebooks/quickstart.ipynb` runs from start to end (nbclient, as Jupyter would: from the
notebooks/ directory), on a slice of the standard library in this test's directory."""

import json
import os

import nbformat
from nbclient import NotebookClient

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOK = os.path.join(REPO, "notebooks", "quickstart.ipynb")


def _parameters_cell(notebook):
  cells = [c for c in notebook.cells if "parameters" in c.metadata.get("tags", [])]
  assert len(cells) == 1, "the notebook needs one cell tagged 'parameters'"
  return cells[0]


def test_quickstart_notebook_runs(stdlib_slice, tmp_path):
  notebook = nbformat.read(NOTEBOOK, as_version=4)
  workdir = tmp_path / "run"
  _parameters_cell(notebook).source = "\n".join([
      f"WORKDIR = {str(workdir)!r}", f"FIGURES = {str(tmp_path / 'figures')!r}", "STEPS = 30",
      f"DATA_DIR = {str(tmp_path / 'tfds')!r}", f"SOURCE_ROOT = {stdlib_slice!r}"])
  NotebookClient(notebook, timeout=600, kernel_name="python3",
                 resources={"metadata": {"path": os.path.join(REPO, "notebooks")}}).execute()

  outputs = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.outputs]
  text = "".join(o.get("text", "") for o in outputs)
  images = [o for o in outputs if "image/png" in o.get("data", {})]
  assert len(images) == 2  # the learning curve and the expert usage
  assert "TransformerLM trained for 30 steps" in text
  # The last cell prints the prompt and 80 sampled bytes after it (a 30-step model's bytes:
  # any characters, newlines included).
  generated = text.split("TransformerLM trained for 30 steps\n", 1)[1]
  assert generated.startswith("def ") and len(generated.rstrip("\n")) > len("def ")
  with open(workdir / "metrics.jsonl") as f:
    assert max(json.loads(line)["step"] for line in f) == 30
  assert (tmp_path / "figures" / "learning_curves.png").exists()
