#!/usr/bin/env bash
# GPU check for the memory bound, < 8 minutes on one CUDA machine:
#   1. `inferq calibrate` on cuda for both backends (torch, onnx);
#   2. for each backend, a stack (redis + worker with INFERQ_MEMORY_BUDGET + API) and a
#      burst that would blow the budget without the bound: many concurrent clients, each
#      sending jobs of long inputs at once;
#   3. prints peak device memory of the worker vs. the budget, OOM count, items/s;
#   4. the torch burst again with two workers sharing the device (INFERQ_WORKERS_PER_DEVICE=2):
#      their summed nvidia-smi peak against the one budget they split.
# Usage: scripts/gpu_check.sh            (BUDGET=2GiB CLIENTS=64 JOBS=6 INPUTS=16 to tune)
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PY:-.venv/bin/python}
BUDGET=${BUDGET:-2GiB}
CLIENTS=${CLIENTS:-64}
JOBS=${JOBS:-6}       # jobs per client
INPUTS=${INPUTS:-16}  # long inputs per job (~256 tokens each)
DEVICE=${DEVICE:-cuda}

if ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
  echo "gpu_check: torch sees no CUDA device; install a CUDA build of torch in .venv" >&2
  exit 2
fi
command -v redis-server >/dev/null || { echo "gpu_check: redis-server not on PATH" >&2; exit 2; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
"$PY" -c 'import onnxruntime as o; print("onnxruntime", o.__version__, o.get_available_providers())' || true

WORK=$(mktemp -d /tmp/inferq-gpu-check.XXXXXX)
export INFERQ_DATA_DIR="$WORK/data"
PIDS=()
cleanup() {
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap cleanup EXIT

free_port() { "$PY" -c 'from inferq.redis_server import free_port; print(free_port())'; }

calibrate() {  # $1 = backend
  echo "=== calibrate minilm/$1/$DEVICE, budget $BUDGET ==="
  timeout 170 "$PY" -m inferq.cli calibrate \
    --model minilm --backend "$1" --device "$DEVICE" --budget "$BUDGET" --time-limit-s 100 --no-progress \
    2> >(grep -v "Loading weights" >&2) || echo "calibrate $1 failed (rc=$?)"
}

burst() {  # $1 = backend, $2 = workers sharing the device (default 1)
  local backend=$1 workers=${2:-1} rport aport log wpids=""
  rport=$(free_port)
  redis-server --port "$rport" --save '' --appendonly no --daemonize no >"$WORK/redis-$backend.log" 2>&1 &
  PIDS+=($!)
  export INFERQ_REDIS_URL="redis://127.0.0.1:$rport/0"
  for _ in $(seq 50); do "$PY" -c "import redis,sys; redis.Redis(port=$rport).ping()" 2>/dev/null && break; sleep 0.1; done
  for k in $(seq "$workers"); do
    log="$WORK/worker-$backend-$workers-$k.log"
    INFERQ_MODEL=minilm INFERQ_BACKEND=$backend INFERQ_DEVICE=$DEVICE INFERQ_MEMORY_BUDGET=$BUDGET \
      INFERQ_WORKERS_PER_DEVICE=$workers INFERQ_WORKER_ID="gpu-check:$k" \
      INFERQ_MAX_BATCH_SIZE=512 INFERQ_MAX_WAIT_MS=20 INFERQ_LOG_LEVEL=INFO \
      "$PY" -m inferq.cli worker >"$log" 2>&1 &
    PIDS+=($!)
    wpids="$wpids${wpids:+,}$!"
  done
  aport=$(free_port)
  INFERQ_MODEL=minilm "$PY" -m inferq.cli api --port "$aport" >"$WORK/api-$backend.log" 2>&1 &
  PIDS+=($!)
  echo "=== burst minilm/$backend x $workers worker(s): $CLIENTS clients x $JOBS jobs x $INPUTS long inputs, budget $BUDGET ==="
  timeout 150 "$PY" - "$aport" "$wpids" "$BUDGET" "$CLIENTS" "$JOBS" "$INPUTS" <<'PYEOF' || echo "burst $backend failed (rc=$?)"
import asyncio, subprocess, sys, threading, time
import httpx
from inferq.worker.calibration.fit import fmt_bytes, parse_budget

port, budget_text = int(sys.argv[1]), sys.argv[3]
wpids = {int(p) for p in sys.argv[2].split(",")}
clients, jobs, inputs = (int(x) for x in sys.argv[4:7])
base = f"http://127.0.0.1:{port}"
total = int(subprocess.run(["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits",
                            "-i", "0"], capture_output=True, text=True).stdout.split()[0]) * 2**20
budget = parse_budget(budget_text, total)

def worker_mib() -> int:
    out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory",
                          "--format=csv,noheader,nounits"], capture_output=True, text=True).stdout
    return sum(int(m) for p, m in (l.split(",") for l in out.strip().splitlines() if "," in l)
               if int(p) in wpids)

deadline = time.monotonic() + 90
while True:  # the worker loads the model (and exports ONNX on first use)
    try:
        if httpx.get(f"{base}/readyz", timeout=2).status_code == 200:
            break
    except httpx.HTTPError:
        pass
    if time.monotonic() > deadline:
        sys.exit("worker/API not ready within 90 s")
    time.sleep(0.5)

peak = {"mib": worker_mib()}
idle_mib = peak["mib"]
stop = threading.Event()
def sample() -> None:
    while not stop.is_set():
        peak["mib"] = max(peak["mib"], worker_mib())
        time.sleep(0.05)
threading.Thread(target=sample, daemon=True).start()

long_text = " ".join(["inference servers run out of memory under bursts of long inputs"] * 30)
async def client(c: httpx.AsyncClient, i: int) -> tuple[int, int]:
    ok = failed = 0
    for j in range(jobs):
        texts = [f"{i} {j} {k} {long_text}" for k in range(inputs)]
        r = await c.post(f"{base}/v1/infer", json={"inputs": texts, "wait": 60})
        body = r.json()
        if r.status_code == 200 and body.get("status") == "succeeded":
            ok += len(texts)
        else:
            failed += len(texts)
            print("failed:", r.status_code, str(body)[:200])
    return ok, failed

async def main() -> tuple[int, int, float]:
    t0 = time.perf_counter()
    async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=clients)) as c:
        res = await asyncio.gather(*(client(c, i) for i in range(clients)))
    return sum(r[0] for r in res), sum(r[1] for r in res), time.perf_counter() - t0

ok, failed, elapsed = asyncio.run(main())
stop.set()
time.sleep(0.1)
unbounded = clients * inputs * 256  # padded tokens if every in-flight job ran as one batch
peak_b = peak["mib"] * 2**20
print(f"items ok={ok} failed={failed} in {elapsed:.1f}s → {ok / elapsed:.1f} items/s")
print(f"worker device memory ({len(wpids)} worker(s), summed): idle {fmt_bytes(idle_mib * 2**20)}, peak {fmt_bytes(peak_b)} "
      f"(nvidia-smi, incl. CUDA context) vs budget {fmt_bytes(budget)} "
      f"→ {'WITHIN' if peak_b <= budget else 'OVER'} ({peak_b / budget:.0%})")
print(f"without the bound: up to {unbounded} padded tokens in one batch")
PYEOF
  echo "--- worker log (ceiling, OOM lines) ---"
  grep -hiE "ceiling|device budget|provider|runs on" "$WORK"/worker-"$backend"-"$workers"-*.log | head -6 || true
  echo "OOM events in worker logs: $(cat "$WORK"/worker-"$backend"-"$workers"-*.log | grep -ciE "out of memory|OutOfMemory|oom" || true)"
  grep -hE "batch items=" "$WORK"/worker-"$backend"-"$workers"-*.log | tail -2 || true
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  PIDS=()
}

START=$SECONDS
calibrate torch
calibrate onnx
burst torch
burst onnx
burst torch 2
echo "gpu_check done in $((SECONDS - START)) s; logs and calibration under $WORK"
