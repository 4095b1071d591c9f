#!/usr/bin/env bash
# Download, here, the wheels gpuplan needs on the lent GPU machine and its image lacks (.library/device/KINDS.md lists
# what the image holds: CUDA torch, transformers, peft, accelerate, but no pydantic, tomlkit, bitsandbytes or datasets),
# as CPython 3.12 x86-64 wheels, into .whl/ (git-ignored; the device tool carries it: run(carry=[".whl"])).
# Versions: the ones this checkout's environment runs, so the device runs what the tests ran.
#
#   benchmarks/device/fetch_wheels.sh            # then: benchmarks/device/run_checks.sh on the device
set -euo pipefail
cd "$(dirname "$0")/../.."
py=${PYTHON:-.venv/bin/python}  # the checkout's environment (README's install), whose versions the tests ran
[ -x "$py" ] || py=python3
version() { "$py" -c "import importlib.metadata as m; print(m.version('$1'))"; }
pkgs=()
for name in pydantic pydantic_core annotated-types typing-inspection typing_extensions tomlkit bitsandbytes datasets dill multiprocess; do
  pkgs+=("$name==$(version "$name")")
done
tmp=$(mktemp -d)  # .whl/ is replaced only once every wheel is here
"$py" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any \
  -d "$tmp" "${pkgs[@]}"
rm -rf .whl && mv "$tmp" .whl
du -sh .whl && ls .whl
