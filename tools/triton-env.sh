#!/usr/bin/env bash
# The environment edge-app infer-server runs Triton in: nvidia-pytriton 0.7.0 (it bundles Triton Inference Server
# 2.51 with its Python backend) pins numpy < 2, so it cannot share the app's .venv; and its Python stub needs the
# system interpreter here (/usr/bin/python3, Debian's 3.11). Made once, next to .venv; run again to repair it.
# EDGE_APP_TRITON_GPU=1 puts onnxruntime-gpu in it instead of onnxruntime (a GPU box: infer-server --providers
# cuda,cpu); the two cannot share an environment, so the other one is removed first.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${TRITON_PYTHON:-/usr/bin/python3}
[ -x .venv-triton/bin/python ] || "$PY" -m venv .venv-triton
if [ "${EDGE_APP_TRITON_GPU:-0}" = 1 ]; then ORT=onnxruntime-gpu OTHER=onnxruntime; else ORT=onnxruntime OTHER=onnxruntime-gpu; fi
.venv-triton/bin/pip uninstall -q -y "$OTHER" 2>/dev/null || true
grep -v '^onnxruntime' tools/triton-requirements.txt > .venv-triton/requirements.txt
echo "$ORT>=1.18" >> .venv-triton/requirements.txt
.venv-triton/bin/pip install -q -r .venv-triton/requirements.txt
.venv-triton/bin/python -c "import pytriton, numpy, onnxruntime as o; print('triton env ready: numpy', numpy.__version__, \
'onnxruntime providers', o.get_available_providers())"
