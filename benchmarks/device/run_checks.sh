#!/usr/bin/env bash
# On the lent GPU machine (the device tool's `run`, with carry [".whl"] from benchmarks/device/fetch_wheels.sh): install
# the carried wheels offline beside the image's CUDA torch, transformers and peft, then run the GPU checks, one command:
#   1. benchmarks/host_overhead.py --device cuda: the GPU host's cost per kernel and per Trainer step, the priors
#      benchmarks/fit_step_time.py takes from host_overhead-cuda.json in benchmarks/data/ (about a minute);
#   2. benchmarks/kernel_counts.py --device cuda: the kernels a layer launches (cudaLaunchKernel calls, and the kernels
#      the GPU ran), beside the step-time model's counts (under a minute);
#   3. benchmarks/gpu_check.py: measured memory and tokens/s of real small models through `gpuplan apply`, beside the
#      plan (cases not started within GPU_CHECK_BUDGET_S, default 120 s, are skipped and counted; its JSON holds what
#      it measured after every case). Caps: 150 + 90 + 120 + 180 = 540 s, under the 590 s asked of the tool with the
#      wheels' install and the checks before them.
# What comes back ($OUT, at most 8 files): the three JSON files, RESULTS.md with their sections, nvidia-smi's line and the
# log. Copy the JSON files into benchmarks/data/ and the sections into benchmarks/RESULTS.md, then rerun
# benchmarks/fit_step_time.py here. The device's device time is short: run this once, with a timeout that leaves a rerun.
#
#   run(command="bash benchmarks/device/run_checks.sh", carry=[".whl"], timeout_s=590)
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-$PWD/device-out}  # the device tool sets OUT; elsewhere a git-ignored folder
mkdir -p "$out"
exec > >(tee "$out/run_checks.log") 2>&1
export PYTHONUNBUFFERED=1  # what a killed step printed reaches the log
site=$(mktemp -d)
python3 -m pip install --quiet --no-index --no-deps --target "$site" .whl/*.whl || { echo "wheels did not install"; exit 1; }
export PYTHONPATH="$PWD:$site${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv > "$out/nvidia-smi.csv" 2>&1
python3 -c "import torch, transformers, peft, pydantic, bitsandbytes; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(0), 'transformers', transformers.__version__, 'peft', peft.__version__, 'bitsandbytes', bitsandbytes.__version__)"
status=0
budget=${GPU_CHECK_BUDGET_S:-120}
timeout 150 python3 benchmarks/host_overhead.py --device cuda --json "$out/host_overhead-cuda.json" || status=1
timeout 90 python3 benchmarks/kernel_counts.py --device cuda --json "$out/kernel_counts-cuda.json" || status=1
timeout $(( budget + 180 )) python3 benchmarks/gpu_check.py --device cuda --budget-s "$budget" --json "$out/gpu_check-cuda.json" || status=1
cp benchmarks/RESULTS.md "$out/RESULTS.md"
exec >&- 2>&-  # close the pipe to tee and let it write the log's end
wait
exit $status
