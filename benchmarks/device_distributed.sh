#!/usr/bin/env bash
# One device call on a machine of several GPUs (issue 21): the baseline script
# (benchmarks/probes/dt_baseline.py, copied from ../shared/probes) and ours side by side, NCCL,
# NVLink multicast off. Logs and JSON under $OUT. Usage (device machine, repo root):
#   bash benchmarks/device_distributed.sh
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD" NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
nvidia-smi topo -m 2>&1 | head -5 | tee -a "$OUT/gpu.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'gpus', torch.cuda.device_count())" | tee -a "$OUT/gpu.txt"
timeout 240 python3 benchmarks/distributed_bench.py --out "$OUT/distributed.json" 2>&1 | grep -v -i warn | tee "$OUT/ours.log"
timeout 200 python3 benchmarks/probes/dt_baseline.py 2>&1 | grep -v -i warn | tee "$OUT/baseline.log"
