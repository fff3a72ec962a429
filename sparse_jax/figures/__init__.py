"""The papers' figures, each computed from a run directory or a benchmark JSON.

Every figure module has a `compute_*` function returning the numbers behind the plot (plain
lists and floats, JSON-ready) and a `plot_*` function drawing them; `figures.py` at the
repository root is the command line. `output.save` writes `<name>.png` beside `<name>.json`.
"""
