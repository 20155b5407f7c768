#!/usr/bin/env bash
# One device call for the word-pair split forward (v8): the GPU tests of the split path and a
# bf16 sweep of pairs against the unpaired kernel and the register-fit settings, logs under $OUT.
# Usage (device machine, repo root): bash benchmarks/device_pairs.sh
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TRITON_DEFAULT_FP_FUSION=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/gpu.txt
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a $OUT/gpu.txt
PORTABLE_SOFTMAX_REQUIRE_DEVICE=cuda timeout 220 python3 -m pytest tests/test_softmax.py -q -p no:cacheprovider -k "cuda and (split or pairs or regime or replayed or alignment or matches_torch)" -x 2>&1 | tail -15 | tee $OUT/tests.log
SWEEP_SHAPES=16384x32768,16384x65536,8192x131072,4096x262144,4096x50257,4096x151936,32x128256,1x128256 timeout 340 python3 benchmarks/sweep.py bfloat16 base,unpaired,fit128k,fit160k,c16k,c16k_fit128k 2>&1 | grep -v -i warn | tee $OUT/sweep.log
