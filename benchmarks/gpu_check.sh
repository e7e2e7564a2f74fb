#!/usr/bin/env bash
# GPU check of issue 5, one prepared script for a single-GPU machine.
#
#   bash benchmarks/gpu_check.sh            # from anywhere; logs to $OUT (or /tmp/gpu_check_out)
#   PYTHON=/path/to/python OUT=/tmp/o bash benchmarks/gpu_check.sh
#
# Needs: python with torch (CUDA build; 2.11 is fine: collectives.py feature-detects
# all_gather_single), pytest for step 1. Does NOT need hydra-core or nox: it calls the
# library directly (PYTHONPATH=src). Steps, each under its own time limit so the whole
# run stays under 8 minutes:
#   1. pytest -m requires_gpu                                   (<= 90 s)
#   2. run_point smoke on CUDA: NCCL for cp=1, gloo with CUDA tensors for cp=2 and 4
#      (NCCL refuses several ranks per GPU), even and uneven plans  (<= 100 s)
#   3. the benchmark on CUDA: local work at production shape (H=7168 bf16, 8k/16k
#      tokens, cp 8)                                             (<= 150 s)
#   4. the benchmark on CUDA: even-plan ratio and uneven table    (<= 120 s)
# Files in $OUT: summary.txt, pytest.log, smoke.log, bench_local.{log,json},
# bench_rest.{log,json}. Exit code: number of failed steps (0 = all passed).
# Testing the script itself without a GPU: GPU_CHECK_DEVICE=cpu BENCH_ARGS=--quick.
set -u
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
OUT="${OUT:-${TMPDIR:-/tmp}/gpu_check_out}"
mkdir -p "$OUT"
PY="${PYTHON:-python3}"
DEVICE="${GPU_CHECK_DEVICE:-cuda}"
BENCH_ARGS="${BENCH_ARGS:-}"
export PYTHONPATH="$REPO/src:$REPO${PYTHONPATH:+:$PYTHONPATH}"
SUMMARY="$OUT/summary.txt"
: >"$SUMMARY"
T0=$(date +%s)
failed=0

{
  echo "gpu_check.sh  $(date -u +%Y-%m-%dT%H:%M:%SZ)  host $(hostname)"
  echo "nproc $(nproc); cpu $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | sed 's/^/gpu /'
  "$PY" - <<'EOF' 2>&1
import platform, torch, torch.distributed as dist
nccl = ".".join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() else ""
print(f"python {platform.python_version()}, torch {torch.__version__}, cuda {torch.version.cuda}, nccl {nccl}, "
      f"gpus {torch.cuda.device_count()}, all_gather_single {hasattr(dist, 'all_gather_single')}")
for mod in ("pytest", "hydra", "nox", "deep_ep"):
    try:
        __import__(mod)
        print(f"{mod}: importable")
    except ImportError:
        print(f"{mod}: not importable")
EOF
} | tee -a "$SUMMARY"

step() {  # step NAME LIMIT_S CMD...
  local name=$1 limit=$2
  shift 2
  local t=$(date +%s)
  echo "== $name (limit ${limit}s): $*" | tee -a "$SUMMARY"
  timeout --kill-after=10 "$limit" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  local verdict=PASS
  if [ $rc -ne 0 ]; then verdict="FAIL (rc=$rc$([ $rc -eq 124 ] && echo ', timed out'))"; failed=$((failed + 1)); fi
  echo "   $verdict in $(($(date +%s) - t)) s; tail of $name.log:" | tee -a "$SUMMARY"
  tail -n 25 "$OUT/$name.log" | sed 's/^/   | /' | tee -a "$SUMMARY"
}

if "$PY" -c "import pytest" 2>/dev/null; then
  # Only the modules that hold GPU tests: the others import hydra, absent there.
  step pytest 90 "$PY" -m pytest -m requires_gpu -q -rs -p no:cacheprovider \
    tests/test_roundtrip.py tests/test_alternatives.py
else
  echo "== pytest: SKIPPED (pytest not importable)" | tee -a "$SUMMARY"
fi
step smoke 100 "$PY" benchmarks/smoke_run_point.py --device "$DEVICE" --cp 1,2,4
# shellcheck disable=SC2086  # BENCH_ARGS is a list of options
step bench_local 150 "$PY" benchmarks/bench_comm.py --device "$DEVICE" --sections local --timeout 120 \
  --out "$OUT/bench_local.json" $BENCH_ARGS
# shellcheck disable=SC2086
step bench_rest 120 "$PY" benchmarks/bench_comm.py --device "$DEVICE" --sections even,uneven --timeout 100 \
  --out "$OUT/bench_rest.json" $BENCH_ARGS

echo "gpu_check: $failed step(s) failed; wall $(($(date +%s) - T0)) s; logs in $OUT" | tee -a "$SUMMARY"
exit $failed
