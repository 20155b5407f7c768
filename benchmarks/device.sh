#!/usr/bin/env bash
# The one device runner: each argument names a section, run in order, logs and JSON under $OUT.
# Keep a call's sections under the device's 10 minutes. Usage (device machine, repo root):
#   bash benchmarks/device.sh SECTION [SECTION ...]
#
# Tests (PORTABLE_SOFTMAX_REQUIRE_DEVICE=cuda: a test that finds no GPU fails rather than skips)
#   tests          the GPU tests of split rows, strided reductions (the sliced regime's among
#                  them), the fused regimes and graphs, in four processes (compiles dominate)
#   tests-fused    every fused test on cuda (the fused kernels of every regime, over other
#                  dimensions, against the composite, the rest) in four processes
#   tests-all      every test with cuda in its name and the device layer's, stopping at the first
#                  failure (TESTS_K: another -k expression)
# The library's own commands
#   check          `python -m portable_softmax` (the self-check)
#   validate       `portable-softmax validate` (its checks include the fused variants)
#   bench          `portable-softmax bench --backward` against torch eager and torch.compile
#   fused          `portable-softmax bench --cases fused` (ours, torch's composite eager and
#                  compiled), then the fused calls against the plain kernels
#                  (probes/fused_vs_plain.py; FUSED_ARGS passed on, e.g. `--only temperature`)
#   real           `portable-softmax bench --cases real` with the peers: torch eager and
#                  torch.compile; Liger and FlagGems from .whl/ when carried; QuACK when
#                  QUACK_DIR names its prepared folder (../shared/peers/README.md)
# The loss and whole models (issues 32, 34)
#   tests-loss     the GPU tests of the loss, the head (linear_cross_entropy), the learnable mask,
#                  enable() and the unserved tensors (every test with cuda in its name in those
#                  files; four pytest-xdist workers)
#   loss           `portable-softmax bench --cases loss` with the peers: torch eager, torch.compile,
#                  Liger from .whl/ (FlagGems when LOSS_PEERS names it), ours with
#                  inplace_backward, QuACK when QUACK_DIR names its prepared folder (LOSS_BENCH_ARGS
#                  passed on, e.g. `--M 4096 --N 50257`: that shape alone)
#   head           `portable-softmax bench --cases head` (linear_cross_entropy, bf16, hidden 4096, vocab
#                  128256 and 151936) with the peers: torch eager, torch.compile, Liger's FLCE and Cut
#                  Cross-Entropy from .whl/, QuACK's chunked LCE when QUACK_DIR names its prepared folder
#                  (HEAD_PEERS: another list)
#   loss-sweep     loss_sweep.py: the loss's split rows against the streamed loop on the bench's six
#                  shapes, and the split's settings (warps, grid, pipeline, chunk) on two bf16
#                  shapes, each checked against torch in float64 first (about 6 minutes: run it
#                  alone in a call; LOSS_SWEEP_ARGS passed on, e.g. `--setting base --setting loop`;
#                  `--dtype bfloat16 --setting base --setting alone-split`: the forward alone
#                  streamed, as the CUDA rows plan it, against split by arrival)
#   head-budget    head_budget.py: linear_cross_entropy under chunk budgets of 64 MiB to 1 GiB, float32
#                  and bf16 sums of the weight's gradient, time against memory, beside Liger from .whl/
#   losshost       loss_host.py (v29): the loss's host time per call window by window, wall per call
#                  back to back and do_bench three times in a row, fwd+bwd and fwd, ours against torch
#                  eager and Liger from .whl/, 8192x32000 and 4096x50257 bf16 (LOSS_HOST_CASES)
#   loss-sweep-ab  loss_sweep.py with LOSS_SWEEP_ARGS in this tree, then LOSS_SWEEP_BASE_ARGS (default
#                  `--setting base`) in ab_base/, then this tree again (LOSS_SWEEP_AB_ARGS: both sides';
#                  LOSS_SWEEP_SIDES, default "new base new": other names run the copy in ab_NAME/)
#   losshost-ab    loss_host.py in this tree and in ab_base/ (a base's package: `git archive REV
#                  portable_softmax | tar -x -C ab_base`, carried), new base new base, ours and torch
#   enable         enable_bench.py: a small and a large Transformer's step with and without enable()
#   firstcall      first_call.py: each case's first call in a fresh process with an empty Triton cache
#                  (cold), then with the cache it left (warm), beside Liger's (from .whl/), and a first
#                  call after `portable-softmax warmup`; the forward + backward cases and the sliced
#                  column also cold with nothing compiled ahead (each backward at the backward, each
#                  sliced normalize at its launch), and those two cold
#                  runs' compile timelines per thread (`--timeline`, probes/compile_timeline.py; issue 34;
#                  FIRSTCALL_ARGS passed on, e.g. `--case "column softmax 32768x1024 bf16, dim 0"`)
#   shortbwd       shortbwd.py (issue 34 item 9): the backward of short rows, op and through autograd,
#                  ours against torch eager and FlagGems from .whl/ (do_bench, the kernels alone, wall
#                  per call), the host's share per layer, and our backward under SHORTBWD_VARIANTS
# Sweeps
#   sweep          sweep.py over SWEEP_SHAPES (default: the split shapes) for the variants of
#                  SWEEP_VARIANTS (default base) and SWEEP_DTYPES
#   sweep-twice    the same twice, the variants in opposite orders (the second checks the first)
#   strided        strided_sweep.py with its SWEEP tunings beside the default, torch eager and
#                  torch.compile in the same run (STRIDED_ONLY: comma-separated words; the cases
#                  whose names hold one of them)
#   strided-quick  strided_sweep.py --quick: the default tuning only (STRIDED_ONLY as above)
#   diagnose       diagnose.py: host and GPU time of a few shapes
# Against a base copy of the package in ab_base/ (`git archive BASE portable_softmax | tar -x -C ab_base`)
#   ab             sweep.py on each side (NEW_VARIANTS / BASE_VARIANTS, NEW_DTYPES / BASE_DTYPES)
#   sliced         strided_sweep.py --quick over the sliced and contiguous rows of 50257: new, base, new
#   combine        strided_sweep.py (SWEEP tunings) over the split strided cases: new, base
#   call-path      host time per call (call_path.py) of new, base, new, with the peers on new
#   call-bandwidth `portable-softmax bench --backward` of base and new, then the call-path tests
# Other machines and tools
#   distributed    distributed_bench.py and the issue's baseline (probes/dt_baseline.py) on every
#                  GPU of the host, NCCL, NVLink multicast off
#   vocab-parallel 2 GPUs, NCCL, multicast off (issue 33): the GPU tests of the vocabulary-parallel
#                  loss and head (tests/test_distributed_loss.py -k cuda), then vocab_parallel_bench.py
#                  under torchrun: ours against torch's DTensor loss_parallel, bf16, forward + backward,
#                  8192x128256 and 16384x151936 split in 2 (VOCAB_CASES), the target 1.2 x (local loss
#                  + collectives); then probes/vocab_parallel_host_ops.py: a call's ops and host time
#   ncu            Nsight Compute counters of probes/ncu_cases.py (NCU_CASES: space-separated names)
#   probe:NAME     benchmarks/probes/NAME.py (PROBE_ARGS passed on), e.g. probe:causal_floor
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PORTABLE_SOFTMAX_REQUIRE_DEVICE=cuda
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
SITE=/tmp/site
SPLIT_SHAPES=16384x32768,4096x262144,4096x151936,256x151936,32x128256,4096x50257
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'gpus', torch.cuda.device_count())" \
  | tee -a "$OUT/gpu.txt"

run_tests() { timeout 300 python3 -m pytest -q -p no:cacheprovider "$@" 2>&1 | grep -E "passed|failed|FAILED|Error" | tail -12; }
quiet() { grep -v -i -E "warn|online softmax|split the reduction|important use case|^softmax\.$|^$"; }
only() { local words; [ -n "${STRIDED_ONLY:-}" ] || return 0; IFS=, read -ra words <<< "$STRIDED_ONLY"; printf -- '--only\0'; printf '%s\0' "${words[@]}"; }
# The peers' wheels (Liger, FlagGems), when carried in .whl/.
peer_wheels() {
  if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" .whl/*.whl
  fi
}
# Runs its command with the package of one side first on the path: new (this tree) or base (ab_base/).
# A side of an A/B: "new" is this tree, any other NAME the package copy in ab_NAME/ (carried).
side() { local root="$PWD"; [ "$1" != new ] && root="$PWD/ab_$1"; shift; PYTHONPATH="$root:$PYTHONPATH" "$@"; }
sweep() { SWEEP_SHAPES=${SWEEP_SHAPES:-$SPLIT_SHAPES} timeout "${SWEEP_TIMEOUT:-300}" python3 benchmarks/sweep.py "$@" 2>&1 | quiet; }

for section in "$@"; do
  echo "=== $section"
  case "$section" in
    tests)
      run_tests tests/test_strided.py -k cuda > "$OUT/tests-strided.log" &
      run_tests tests/test_fused.py -k "cuda and every_regime" > "$OUT/tests-fused-regimes.log" &
      run_tests tests/test_softmax.py -k "cuda and (ticketed or split or pipelined or persistent)" > "$OUT/tests-split.log" &
      run_tests tests/test_call_path.py -k "cuda and graph" > "$OUT/tests-graph.log" &
      wait
      tail -n 12 "$OUT"/tests-{strided,fused-regimes,split,graph}.log ;;
    tests-fused)
      run_tests tests/test_fused.py -k "cuda and every_regime" > "$OUT/tests-fused-regimes.log" &
      run_tests tests/test_fused.py -k "cuda and other_dimensions" > "$OUT/tests-fused-dims.log" &
      run_tests tests/test_fused.py -k "cuda and composite" > "$OUT/tests-fused-composite.log" &
      run_tests tests/test_fused.py -k "cuda and not (every_regime or other_dimensions or composite)" \
        > "$OUT/tests-fused-rest.log" &
      wait
      tail -n 12 "$OUT"/tests-fused-*.log ;;
    tests-all)
      timeout 400 python3 -m pytest tests -q -p no:cacheprovider -k "${TESTS_K:-cuda or device_layer}" -x 2>&1 | tail -25 \
        | tee "$OUT/tests.log" ;;
    check)
      timeout 120 python3 -m portable_softmax 2>&1 | tail -40 | tee "$OUT/check.log" ;;
    validate)
      timeout 300 python3 -m portable_softmax validate --out "$OUT/validate" 2>&1 | quiet > "$OUT/validate.log"
      grep -E "PASS|FAIL|passed|failed" "$OUT/validate.log" | head -20 ;;
    bench)
      timeout 420 python3 -m portable_softmax bench --backward --peers torch compile --out "$OUT/bench" --no-progress 2>&1 \
        | quiet | tail -40 | tee "$OUT/bench.log" ;;
    fused)
      timeout 200 python3 -m portable_softmax bench --cases fused --peers torch compile --out "$OUT/fused" 2>&1 | quiet \
        | tee "$OUT/fused.log"
      timeout 150 python3 benchmarks/probes/fused_vs_plain.py ${FUSED_ARGS:-} 2>&1 | quiet | tee "$OUT/fused-vs-plain.log" ;;
    tests-loss)
      timeout 240 python3 -m pytest -q -p no:cacheprovider -k cuda -n 4 tests/test_loss.py tests/test_head.py \
        tests/test_mask_grad.py tests/test_enable.py tests/test_unserved.py 2>&1 | grep -E "passed|failed|FAILED|Error" \
        | tail -20 | tee "$OUT/tests-loss.log" ;;
    loss)
      peer_wheels
      # LOSS_PEERS: FlagGems 5.0.2's cross_entropy_loss ended the H100 run of 2026-11-25 and the
      # H200's of 2026-11-28 with an illegal memory access (the process's CUDA context with it), so
      # it is left out unless named. "inplace": ours with inplace_backward=True, whose memory
      # beyond the inputs the issue compares with Liger's (which writes into the logits).
      peers="${LOSS_PEERS:-torch compile liger inplace}"
      if [ -n "${QUACK_DIR:-}" ]; then
        if source "$QUACK_DIR/B/setup.sh" "$QUACK_DIR"; then peers="$peers quack"; else echo "quack: not set up"; fi
      fi
      PYTHONPATH="$PYTHONPATH:$SITE" timeout 540 python3 -m portable_softmax bench --cases loss --peers $peers \
        ${LOSS_BENCH_ARGS:-} --out "$OUT/loss" --no-progress 2>&1 | quiet | tee "$OUT/loss.log" ;;
    head)
      peer_wheels
      # Which sum of the weight's gradient this torch gives: float32 inside the matmul, or a pass after it.
      python3 -c "import torch; from portable_softmax import head_chunks as h
print('head: float32 sum inside addmm (out_dtype):', h._adds_wide(torch.device('cuda', 0), torch.bfloat16, torch.float32))" \
        2>&1 | tee "$OUT/head-path.log"
      peers="${HEAD_PEERS:-torch compile liger cce}"
      if [ -n "${QUACK_DIR:-}" ]; then
        if source "$QUACK_DIR/B/setup.sh" "$QUACK_DIR"; then peers="$peers quack"; else echo "quack: not set up"; fi
      fi
      PYTHONPATH="$PYTHONPATH:$SITE" timeout 540 python3 -m portable_softmax bench --cases head --peers $peers --warmup 100 --rep 600 \
        --out "$OUT/head" --no-progress 2>&1 | quiet | tee "$OUT/head.log" ;;
    loss-sweep)
      timeout 570 python3 benchmarks/loss_sweep.py --json "$OUT/loss-sweep.json" ${LOSS_SWEEP_ARGS:-} 2>&1 | quiet \
        | tee "$OUT/loss-sweep.log" ;;
    head-budget)
      peer_wheels
      PYTHONPATH="$PYTHONPATH:$SITE" timeout 400 python3 benchmarks/head_budget.py --json "$OUT/head-budget.json" \
        ${HEAD_BUDGET_ARGS:-} 2>&1 | quiet | tee "$OUT/head-budget.log" ;;
    losshost)
      peer_wheels
      PYTHONPATH="$PYTHONPATH:$SITE" timeout 400 python3 benchmarks/loss_host.py "$OUT/losshost" 2>&1 | quiet \
        | tee "$OUT/losshost.log" ;;
    loss-sweep-ab)
      # A kernel change's A/B: the base takes only settings that mean something in its tree.
      for s in ${LOSS_SWEEP_SIDES:-new base new}; do
        args="${LOSS_SWEEP_ARGS:-} ${LOSS_SWEEP_AB_ARGS:-}"
        [ "$s" != new ] && args="${LOSS_SWEEP_BASE_ARGS:---setting base} ${LOSS_SWEEP_AB_ARGS:-}"
        side "$s" timeout 280 python3 benchmarks/loss_sweep.py --json "$OUT/loss-sweep-$s.json" $args 2>&1 | quiet \
          | sed "s/^/$s /" | tee -a "$OUT/loss-sweep-ab.log"
      done ;;
    losshost-ab)
      # The same in this tree (new) and in ab_base/ (base), alternated, no peers: a host-path change's A/B.
      for s in new base new base; do
        side "$s" timeout 140 python3 benchmarks/loss_host.py "$OUT/losshost-$s" 2>&1 | quiet | grep -E "ours|torch" \
          | sed "s/^/$s /" | tee -a "$OUT/losshost-ab.log"
      done ;;
    enable)
      timeout 240 python3 benchmarks/enable_bench.py --steps 5 2>&1 | quiet | tee "$OUT/enable.log" ;;
    firstcall)
      peer_wheels
      # FIRSTCALL_ARGS as a shell would read it: case names hold spaces, quoted.
      eval "firstcall_args=(${FIRSTCALL_ARGS:-})"
      PYTHONPATH="$PYTHONPATH:$SITE" timeout 560 python3 benchmarks/first_call.py --timeline --out "$OUT/firstcall" \
        "${firstcall_args[@]}" 2>&1 \
        | quiet | tee "$OUT/firstcall.log" ;;
    shortbwd)
      peer_wheels
      PYTHONPATH="$PYTHONPATH:$SITE" timeout 540 python3 benchmarks/shortbwd.py "$OUT/shortbwd" 2>&1 | quiet \
        | tee "$OUT/shortbwd.log" ;;
    real)
      peer_wheels
      peers="torch compile liger flaggems"
      if [ -n "${QUACK_DIR:-}" ]; then
        # setup.sh unpacks QuACK under /tmp/quack-site and puts it on PYTHONPATH.
        if source "$QUACK_DIR/B/setup.sh" "$QUACK_DIR"; then peers="$peers quack"; else echo "quack: not set up"; fi
      fi
      PYTHONPATH="$PYTHONPATH:$SITE" timeout 540 python3 -m portable_softmax bench --cases real --peers $peers \
        --out "$OUT/real" 2>&1 | quiet | tee "$OUT/real.log" ;;
    sweep)
      sweep "${SWEEP_DTYPES:-bfloat16,float32}" "${SWEEP_VARIANTS:-base}" | tee "$OUT/sweep.log" ;;
    sweep-twice)
      variants=${SWEEP_VARIANTS:-base}
      sweep "${SWEEP_DTYPES:-bfloat16,float32}" "$variants" | tee "$OUT/sweep-1.log"
      sweep "${SWEEP_DTYPES:-bfloat16,float32}" "$(echo "$variants" | tr ',' '\n' | tac | paste -sd,)" \
        | tee "$OUT/sweep-2.log" ;;
    strided)
      only | xargs -0 timeout 480 python3 benchmarks/strided_sweep.py --out "$OUT/strided" 2>&1 | quiet \
        | tee "$OUT/strided.log" ;;
    strided-quick)
      only | xargs -0 timeout 480 python3 benchmarks/strided_sweep.py --quick --out "$OUT/strided-quick" 2>&1 | quiet \
        | tee "$OUT/strided-quick.log" ;;
    diagnose)
      timeout 120 python3 benchmarks/diagnose.py bfloat16,float32 32768x256,4096x50257,1x128256 2>&1 | quiet \
        | tee "$OUT/diagnose.log" ;;
    ab)
      for s in new base; do
        if [ "$s" = new ]; then v="${NEW_VARIANTS:-base}"; d="${NEW_DTYPES:-bfloat16,float32}"
        else v="${BASE_VARIANTS:-base}"; d="${BASE_DTYPES:-bfloat16,float32}"; fi
        side "$s" sweep "$d" "$v" | sed "s/^/$s /" | tee "$OUT/sweep-$s.log"
      done ;;
    sliced)
      for s in new base new; do
        side "$s" timeout 200 python3 benchmarks/strided_sweep.py --quick --out "$OUT/sliced-$s" \
          --only sliced "contiguous (4096" 2>&1 | quiet | grep -E "^\| (sliced|contiguous)" | sed "s/^/$s /" \
          | tee -a "$OUT/sliced.log"
      done ;;
    combine)
      for s in new base; do
        side "$s" timeout 280 python3 benchmarks/strided_sweep.py --out "$OUT/combine-$s" \
          --only column transposed "NCHW (8" "NCHW (64" 2>&1 | quiet | grep -E "^\| .*\| ours|failures" \
          | sed "s/^/$s /" | tee -a "$OUT/combine.log"
      done ;;
    call-path)
      peer_wheels
      for s in new base new; do
        peers=""; [ "$s" = new ] && peers="torch compile liger flaggems"
        PYTHONPATH="$PYTHONPATH:$SITE" side "$s" timeout 280 python3 benchmarks/call_path.py "$OUT/eager-$s.json" \
          $peers 2>&1 | quiet | tee -a "$OUT/call-path.log"
      done ;;
    call-bandwidth)
      for s in base new; do
        echo "== $s" | tee -a "$OUT/call-bandwidth.log"
        side "$s" timeout 250 python3 -m portable_softmax bench --backward --peers torch --out "$OUT/bw-$s" \
          --no-progress 2>&1 | quiet | tail -20 | tee -a "$OUT/call-bandwidth.log"
      done
      timeout 200 python3 -m pytest tests -q -p no:cacheprovider \
        -k "cuda and (call_path or regime or split or reread or dtype)" -x 2>&1 | tail -8 | tee "$OUT/tests.log" ;;
    distributed)
      nvidia-smi topo -m 2>&1 | head -5 | tee -a "$OUT/gpu.txt"
      export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
      timeout 240 python3 benchmarks/distributed_bench.py --out "$OUT/distributed.json" 2>&1 | quiet | tee "$OUT/ours.log"
      timeout 200 python3 benchmarks/probes/dt_baseline.py 2>&1 | quiet | tee "$OUT/baseline.log" ;;
    vocab-parallel)
      export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
      timeout 240 python3 -m pytest -q -p no:cacheprovider -k cuda tests/test_distributed_loss.py 2>&1 \
        | grep -E "passed|failed|FAILED|Error" | tail -12 | tee "$OUT/tests-vocab-parallel.log"
      timeout 300 python3 -m torch.distributed.run --nproc-per-node 2 benchmarks/vocab_parallel_bench.py \
        --cases "${VOCAB_CASES:-8192x128256,16384x151936}" --out "$OUT/vocab-parallel.json" 2>&1 | quiet \
        | grep -v -E "^W[0-9]+ |\*\*\*\*|OMP_NUM_THREADS" | tee "$OUT/vocab-parallel.log"
      timeout 200 python3 -m torch.distributed.run --nproc-per-node 2 benchmarks/probes/vocab_parallel_host_ops.py \
        --device cuda --calls 200 --cases "mean,smoothing,z_loss+softcap" 2>&1 | quiet \
        | grep -v -E "^W[0-9]+ |\*\*\*\*|OMP_NUM_THREADS" | tee "$OUT/vocab-host-ops.log" ;;
    ncu)
      metrics=dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sector_hit_rate.pct,smsp__inst_executed.sum
      metrics=$metrics,lts__t_sectors_op_read.sum,lts__t_sectors_op_write.sum
      # Why warps wait (per issued instruction: long scoreboard = global loads, short = MUFU and
      # shared memory) and how busy the pipes are (xu = MUFU's transcendentals): whether a kernel
      # waits on memory, on exp2, or on issue.
      for r in long_scoreboard short_scoreboard math_pipe_throttle mio_throttle lg_throttle barrier \
               membar wait not_selected selected dispatch_stall no_instruction branch_resolving; do
        metrics=$metrics,smsp__average_warps_issue_stalled_${r}_per_issue_active.ratio
      done
      metrics=$metrics,sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active
      metrics=$metrics,sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active
      metrics=$metrics,sm__pipe_alu_cycles_active.avg.pct_of_peak_sustained_active
      metrics=$metrics,sm__inst_executed_pipe_lsu.avg.pct_of_peak_sustained_active
      for c in ${NCU_CASES:-ours_fwd_bf16_4096x262144 ours_fwd_fp32_4096x262144 clone_bf16_4096x262144 \
                 ours_fwd_bf16_16384x32768 ours_bwd_bf16_16384x16384 compile_bwd_bf16_16384x16384}; do
        timeout -k 5 "${NCU_TIMEOUT:-120}" ncu --clock-control none --nvtx --nvtx-include "measure/" \
          --section SpeedOfLight --section Occupancy --section WarpStateStats --section SchedulerStats \
          --section ComputeWorkloadAnalysis --metrics "$metrics" --csv \
          python3 benchmarks/probes/ncu_cases.py "$c" > "$OUT/ncu-$c.csv" 2> "$OUT/ncu-$c.err"
        echo "== $c rc=$?"
        grep -E 'Duration|DRAM Throughput|Achieved Occupancy|Theoretical Occupancy|L2 Hit|lts__t_sector|dram__bytes|lts__t_sectors|Registers Per|Warp Cycles Per Issued|inst_executed|issue_stalled|pipe_|Stall|Issue Slots Busy|Issued Warp Per|No Eligible|Eligible Warps' "$OUT/ncu-$c.csv" \
          | awk -F'","' '{k=$5; sub(/\(.*/, "", k); print substr(k, 1, 40) " | " $(NF-2) " | " $(NF-1) " | " $NF}' | tr -d '"'
      done ;;
    probe:*)
      name=${section#probe:}
      timeout "${PROBE_TIMEOUT:-300}" python3 "benchmarks/probes/$name.py" ${PROBE_ARGS:-} 2>&1 | quiet \
        | tee "$OUT/probe-$name.log" ;;
    *) echo "unknown section $section (see the header of benchmarks/device.sh)" ;;
  esac
done
