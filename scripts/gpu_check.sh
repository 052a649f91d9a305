#!/usr/bin/env bash
# The GPU checks of the fan-out issue in one short run (scripts/gpu_check.py says what each is).
# On a lent GPU machine, from the repository root:
#   bash scripts/gpu_check.sh            # SmolLM2-135M's shape, random weights, on cuda
# It needs torch, transformers and safetensors from the machine's Python. The packages that image
# lacks (pydantic, pydantic_core, annotated-types, typing-inspection) travel as wheels in .whl/:
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux2014_x86_64 -d .whl pydantic==2.14.4 pydantic_core==2.50.5 \
#     annotated-types==0.8.0 typing-inspection==0.4.5
# and the device call carries .whl. Here, `bash scripts/gpu_check.sh --device cpu --small` runs the
# same steps on the CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if ! "$PY" -c "import pydantic" 2>/dev/null && compgen -G ".whl/*.whl" >/dev/null; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/gpu_check_site .whl/*.whl
    export PYTHONPATH=/tmp/gpu_check_site:${PYTHONPATH:-}
fi
export PYTHONPATH=$PWD:${PYTHONPATH:-} PYTHONUNBUFFERED=1
exec "$PY" scripts/gpu_check.py "$@"
