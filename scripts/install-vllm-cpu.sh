#!/usr/bin/env bash
# Set up a venv that can drive vLLM's own allocator (the `vllm` target), CPU only.
#
#   scripts/install-vllm-cpu.sh VENV_DIR [VLLM_VERSION]
#
# VLLM_VERSION is one of the releases kvcheck knows (kvcheck/vllm_releases.py;
# the newest when omitted): 0.34.0 or 0.33.0.  Both pin torch 2.14.0, which the
# index serves only as a CUDA build; torch 2.13.0 CPU runs their allocator and
# scheduler code.
#
# vLLM's declared dependencies pull a multi-GB CUDA torch and GPU-only
# packages, so this installs torch 2.13.0 first, then the packages vLLM's
# allocator and scheduler modules import (requirements-vllm-cpu.txt, pinned;
# einops for the model configuration, whose architecture check imports the
# model's module) and vLLM itself, both without dependency resolution, then this checkout (Hypothesis
# and pytest come with it), pytest-xdist, and ruff (the exported tests are
# checked with it); the test extra's Ray and mypy stay out of this venv.  pip
# warns that vLLM asks for torch 2.14.0 and a few other exact pins: harmless
# for the allocator code.  Where the default index
# serves a CUDA torch, set TORCH_INDEX_URL to an index of CPU wheels.
#
# Kept out of the default set-up (.ci/run); the tests under tests/vllm skip
# when vllm cannot be imported.
set -euo pipefail

if [ "$#" -lt 1 ] || [ "$#" -gt 2 ]; then
    echo "usage: $0 VENV_DIR [VLLM_VERSION]" >&2
    exit 2
fi
venv="$1"
version="${2:-0.34.0}"
case "$version" in
    0.33.0 | 0.34.0) ;;
    *)
        echo "$0: vLLM $version is not a release kvcheck knows (0.33.0, 0.34.0)" >&2
        exit 2
        ;;
esac
checkout="$(cd "$(dirname "$0")/.." && pwd)"

python3 -m venv "$venv"
if [ -n "${TORCH_INDEX_URL:-}" ]; then
    "$venv/bin/pip" install --index-url "$TORCH_INDEX_URL" torch==2.13.0
else
    "$venv/bin/pip" install torch==2.13.0
fi
"$venv/bin/pip" install --no-deps -r "$checkout/requirements-vllm-cpu.txt"
"$venv/bin/pip" install --no-deps "vllm==$version"
"$venv/bin/pip" install -e "$checkout" "pytest-xdist>=3.5" "ruff>=0.6"
# Importing vLLM's allocator takes 7-14 s on a laptop.
"$venv/bin/python" -c "import vllm.v1.core.kv_cache_manager"
echo "vLLM $version target ready; from the checkout: $venv/bin/kvcheck replay regressions/traces/*.json --target vllm"
