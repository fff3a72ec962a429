#!/usr/bin/env bash
# The GPU suite on a node without internet, from a bare checkout to its tables in one folder.
#
#   python -m benchmarks.offline_bundle --python 3.12 --out wheels/   # where an index is reachable
#   bash benchmarks/gpu_offline.sh wheels/ gpu_out/                    # on the node, repo root
#   bash benchmarks/gpu_offline.sh --smoke WHEELS OUT   # anywhere: tiny shapes, no GPU needed
#   TUNE_BUDGET_S=0 bash benchmarks/gpu_offline.sh WHEELS OUT --parts=training   # some parts
#
# Installs the bundle with pip into a fresh folder (no index, no dependencies resolved: the
# bundle holds them, and the node's own JAX, Flax, Optax and Orbax stay as they are), puts it
# on PYTHONPATH, prints the environment, stops if JAX sees no GPU, then runs the GPU suite and
# the block-size sweep (not with TUNE_BUDGET_S=0; TUNE_KERNELS=xl_attention sweeps only the
# fused XL attention's tiles, default cvmm,xl_attention); arguments after OUT_DIR go to the suite.
# Everything it writes lands in OUT_DIR, 8 files (6 with --smoke, which
# runs no tests): environment.txt, gpu_offline.log, gpu_suite.json, gpu_suite.md,
# gpu_tests.log, gpu_tests.xml, decode.json, tune_blocks.json.
# Budget: about 10 minutes on an H100 (SUITE_BUDGET_S + TUNE_BUDGET_S seconds of measuring,
# plus installing, compiling the last cells and writing); override either in the environment.
set -euo pipefail

smoke=()
if [[ ${1:-} == --smoke ]]; then
  smoke=(--smoke)
  shift
fi
if [[ $# -lt 2 ]]; then
  echo "usage: bash benchmarks/gpu_offline.sh [--smoke] WHEELS_DIR OUT_DIR [SUITE_ARGS...]" >&2
  exit 2
fi
if [[ ! -d $1 ]]; then
  echo "no folder $1: build the bundle where an index is reachable with" >&2
  echo "  python -m benchmarks.offline_bundle --python 3.12 --out $1" >&2
  exit 2
fi
wheels=$(cd "$1" && pwd)
mkdir -p "$2"
out=$(cd "$2" && pwd)
suite_budget_s=${SUITE_BUDGET_S:-330}
tune_budget_s=${TUNE_BUDGET_S:-120}
tune_kernels=${TUNE_KERNELS:-cvmm,xl_attention}
python=${PYTHON:-python3}
cd "$(dirname "$0")/.."

if [[ ! -f $wheels/requirements.lock ]]; then
  echo "no requirements.lock in $wheels: build the bundle where an index is reachable with" >&2
  echo "  python -m benchmarks.offline_bundle --python 3.12 --out $1" >&2
  exit 2
fi
exec > >(tee "$out/gpu_offline.log") 2>&1

site=$(mktemp -d "${TMPDIR:-/tmp}/sparse_jax_site.XXXXXX")
# Exactly the bundle's lock, hashes checked: a wheel left in the folder by an older bundle
# (tokamax 0.0.12 once was, and failed on the node's JAX) is not installed.
echo "installing the $(grep -c == "$wheels/requirements.lock") wheels of $wheels/requirements.lock into $site"
"$python" -m pip install --quiet --no-index --no-deps --no-compile --no-cache-dir \
  --disable-pip-version-check --find-links "$wheels" --require-hashes \
  -r "$wheels/requirements.lock" --target "$site"
export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1

"$python" - "${smoke[@]}" <<'PY' | tee "$out/environment.txt"
import importlib.metadata, importlib.util, platform, sys
import jax, jaxlib
print(f"python {platform.python_version()}  jax {jax.__version__}  jaxlib {jaxlib.__version__}")
plugins = sorted(d.metadata["Name"] for d in importlib.metadata.distributions()
                 if d.metadata["Name"] and d.metadata["Name"].startswith("jax-cuda"))
print("cuda plugins:", ", ".join(f"{p} {importlib.metadata.version(p)}" for p in plugins) or "none")
print("backend:", jax.default_backend(), " devices:", jax.devices())
modules = {"flax": "flax", "optax": "optax", "orbax-checkpoint": "orbax", "grain": "grain",
           "tensorflow-datasets": "tensorflow_datasets", "ml-collections": "ml_collections",
           "tokamax": "tokamax"}
for name, module in modules.items():
  spec = importlib.util.find_spec(module)
  if spec is None:
    print(f"{name} not installed")
  else:
    print(f"{name} {importlib.metadata.version(name)} from {spec.submodule_search_locations[0]}")
import sparse_jax
print("sparse_jax from", sparse_jax.__path__[0])
if jax.default_backend() != "gpu" and "--smoke" not in sys.argv:
  sys.exit("no GPU visible to JAX (backend %r): is the CUDA plugin installed and a GPU "
           "attached? Nothing was measured." % jax.default_backend())
PY

"$python" -m benchmarks.gpu_suite "${smoke[@]}" --out "$out" --budget_s "$suite_budget_s" "${@:3}"
if [[ $tune_budget_s != 0 ]]; then
  "$python" -m benchmarks.tune_blocks "${smoke[@]}" --out "$out" --budget_s "$tune_budget_s" \
    --kernels "$tune_kernels"
fi
echo "done: $(ls "$out" | wc -l) files in $out"
ls -l "$out"
