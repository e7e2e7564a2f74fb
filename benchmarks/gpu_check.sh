#!/usr/bin/env bash
# The GPU run, as one prepared script for a machine with one GPU.
#
#   OUT=/tmp/gpu_check bash benchmarks/gpu_check.sh [extra bench_comm.py options]
#   PYTHON=/path/to/python OUT=/tmp/o bash benchmarks/gpu_check.sh
#
# Needs python with a CUDA build of torch (2.11 is fine: nsa_cp_comm.collectives
# picks torch's collective names at import), numpy, tabulate, and pytest plus
# hypothesis (tests/conftest.py) for step 1. Does NOT need hydra-core or nox: it
# runs only library-level tests and scripts (PYTHONPATH=src). Steps, each under
# its own time limit, about 8 minutes at most in all:
#   1. pytest -m requires_gpu, on the test modules that import no hydra    (<= 100 s)
#   2. run_point smoke on CUDA: NCCL for cp 1, gloo with CUDA tensors for cp 2
#      (NCCL refuses two ranks on one GPU); even, uneven and empty-rank plans,
#      FULL and SCATTERED                                                  (<= 100 s)
#   3. the benchmark on CUDA (bench_comm.py --device cuda): even-plan ratio,
#      uneven table, local work at production shape (H=7168 bf16, 8k/16k
#      tokens, cp 8; the staging also on one rank alone, beside the device's
#      copy bandwidth), NCCL cp 1 (its even-plan paired ratio gated at 1.03:
#      a FAIL fails this step); writes $OUT/perf_gpu.json after every section
#                                                                          (<= 270 s)
# Files in $OUT: summary.txt, pytest.log, smoke.log, bench.log, perf_gpu.json.
# Then: cp $OUT/perf_gpu.json benchmarks/data/ && python benchmarks/perf_md.py, commit both.
# Exit code: the number of failed steps (0 = all passed).
# The script itself, without a GPU: GPU_CHECK_DEVICE=cpu bash benchmarks/gpu_check.sh --quick
set -u
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
OUT="${OUT:-/tmp/gpu_check}"
mkdir -p "$OUT"
PY="${PYTHON:-python3}"
DEVICE="${GPU_CHECK_DEVICE:-cuda}"
export PYTHONPATH="$REPO/src:$REPO${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
SUMMARY="$OUT/summary.txt"
: >"$SUMMARY"
T0=$(date +%s)
failed=0

{
  echo "gpu_check.sh  $(date -u +%Y-%m-%dT%H:%M:%SZ)  host $(hostname)  device $DEVICE  bench options: ${*:-none}"
  echo "nproc $(nproc); cpu $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'); load $(cut -d' ' -f1-3 /proc/loadavg)"
  command -v nvidia-smi >/dev/null &&
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | sed 's/^/gpu /'
  "$PY" - <<'EOF' 2>&1
import platform, torch, torch.distributed as dist
nccl = ".".join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() else ""
print(f"python {platform.python_version()}, torch {torch.__version__}, cuda {torch.version.cuda}, nccl {nccl}, "
      f"gpus {torch.cuda.device_count()}, nccl available {dist.is_nccl_available()}")
for mod in ("numpy", "tabulate", "pandas", "pytest", "hypothesis", "hydra", "nox"):
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
  local t
  t=$(date +%s)
  echo "== $name (limit ${limit}s): $*" | tee -a "$SUMMARY"
  timeout --kill-after=10 "$limit" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  local verdict=PASS
  if [ $rc -ne 0 ]; then
    verdict="FAIL (rc=$rc$([ $rc -eq 124 ] && echo ', timed out'))"
    failed=$((failed + 1))
  fi
  echo "   $verdict in $(($(date +%s) - t)) s; tail of $name.log:" | tee -a "$SUMMARY"
  tail -n 30 "$OUT/$name.log" | sed 's/^/   | /' | tee -a "$SUMMARY"
}

if "$PY" -c "import pytest, hypothesis" 2>/dev/null; then
  # Only these modules hold GPU tests and import no hydra at module level.
  step pytest 100 "$PY" -m pytest -m requires_gpu -q -rs -p no:cacheprovider \
    tests/lib/test_roundtrip.py tests/lib/test_alternatives.py tests/lib/test_torch_uneven.py
else
  echo "== pytest: FAIL (pytest or hypothesis not importable; tests/conftest.py needs both)" | tee -a "$SUMMARY"
  failed=$((failed + 1))
fi
step smoke 100 "$PY" benchmarks/smoke_run_point.py --device "$DEVICE" --cp 1,2 --timeout 60
step bench 270 "$PY" benchmarks/bench_comm.py --device "$DEVICE" --timeout 120 --out "$OUT/perf_gpu.json" "$@"

echo "gpu_check: $failed step(s) failed; wall $(($(date +%s) - T0)) s; files in $OUT" | tee -a "$SUMMARY"
[ -f "$OUT/perf_gpu.json" ] &&
  echo "next: cp $OUT/perf_gpu.json $REPO/benchmarks/data/ && $PY benchmarks/perf_md.py" | tee -a "$SUMMARY"
exit $failed
