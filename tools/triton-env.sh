#!/usr/bin/env bash
# The environment edge-app infer-server runs Triton in: nvidia-pytriton 0.7.0 (it bundles Triton Inference Server
# 2.51 with its Python backend) pins numpy < 2, so it cannot share the app's .venv; and its Python stub needs the
# system interpreter here (/usr/bin/python3, Debian's 3.11). Made once, next to .venv; run again to repair it.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${TRITON_PYTHON:-/usr/bin/python3}
[ -x .venv-triton/bin/python ] || "$PY" -m venv .venv-triton
.venv-triton/bin/pip install -q -r tools/triton-requirements.txt
.venv-triton/bin/python -c "import pytriton, numpy, onnxruntime; print('triton env ready: numpy', numpy.__version__)"
