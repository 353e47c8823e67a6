#!/usr/bin/env bash
# The checks only a real NVIDIA GPU host can do (the GPU health and placement issues), in one bounded run:
#   doctor  `muster doctor` lists the GPUs `nvidia-smi` lists (index, UUID, PCI bus id) and finds the node usable;
#   events  the watcher registers NVML events on every GPU (its debug line "watching GPU ... events=...");
#   job     a one-worker job (`--no-python`, no torch needed) runs with the watcher on and gets the planned
#           CUDA_VISIBLE_DEVICES;
#   plan    `muster plan --numa-binding node`: each GPU's NUMA node and CPU list agree with `nvidia-smi topo -m`
#           (NUMA Affinity, CPU Affinity) and with /sys/bus/pci/devices/*/numa_node;
#   flight  with `--hang-timeout`, a worker gets torch's NCCL flight recorder (TORCH_NCCL_TRACE_BUFFER_SIZE,
#           TORCH_NCCL_DUMP_ON_TIMEOUT, TORCH_NCCL_DEBUG_INFO_TEMP_FILE in the attempt directory); with torch in
#           $MUSTER_PYTHON (optional), an NCCL all_reduce job whose rank 1 hangs is judged and its stacks kept.
# Prints the evidence (nvidia-smi -L and topo -m, doctor, plans, the job's log) and one PASS/FAIL line per
# check; exits 1 when a check failed, 2 when the host has no nvidia-smi.
#
# Usage: scripts/gpu-host-check.sh [MUSTER_BINARY]    (default target/release/muster, built if missing)
set -uo pipefail
export LC_ALL=C
cd "$(dirname "$0")/.."

MUSTER="${1:-target/release/muster}"
if ! command -v nvidia-smi >/dev/null; then echo "gpu-host-check: no nvidia-smi: not a GPU host" >&2; exit 2; fi
if [ ! -x "$MUSTER" ] || ! "$MUSTER" --version >/dev/null 2>&1; then
    cargo build --release --quiet || { echo "gpu-host-check: no runnable $MUSTER and cannot build it" >&2; exit 2; }
    MUSTER=target/release/muster
fi
failed=0
verdict() { # verdict NAME OK DETAIL
    if [ "$2" = 1 ]; then echo "PASS $1: $3"; else echo "FAIL $1: $3"; failed=1; fi
}
section() { printf '\n===== %s\n' "$1"; }
# cpus LIST: a CPU list (0-3,8) as sorted numbers on one line.
cpus() {
    tr ',' '\n' <<<"$1" | awk -F- 'NF == 1 && $1 != "" { print $1 } NF == 2 { for (i = $1; i <= $2; i++) print i }' |
        sort -n | tr '\n' ' '
}

section "nvidia-smi -L / driver"
timeout 30 nvidia-smi -L
timeout 30 nvidia-smi --query-gpu=index,name,driver_version,pci.bus_id,memory.total --format=csv
section "nvidia-smi topo -m"
# Some driver versions underline the header with escape sequences even when not on a terminal.
topo="$(timeout 30 nvidia-smi topo -m 2>&1 | sed 's/\x1b\[[0-9;]*m//g')"
echo "$topo"

section "muster doctor --listen 2"
doctor="$(timeout 60 "$MUSTER" doctor --listen 2 2>&1)"
doctor_rc=$?
echo "$doctor"
smi_gpus="$(timeout 30 nvidia-smi --query-gpu=index,uuid,pci.bus_id --format=csv,noheader | tr -d ' ' | tr a-f A-F | sort)"
muster_gpus="$(awk '$1 ~ /^[0-9]+$/ && $2 ~ /^(GPU|MIG)-/ { print $1 "," $2 "," $3 }' <<<"$doctor" | tr a-f A-F | sort)"
n_gpus="$(wc -l <<<"$smi_gpus")"
if [ -n "$smi_gpus" ] && [ "$smi_gpus" = "$muster_gpus" ]; then
    verdict doctor 1 "the same $n_gpus GPU(s) as nvidia-smi (index, UUID, PCI bus id); doctor exit $doctor_rc, $(grep '^verdict' <<<"$doctor")"
else
    verdict doctor 0 "nvidia-smi: [$(tr '\n' ' ' <<<"$smi_gpus")] muster: [$(tr '\n' ' ' <<<"$muster_gpus")]"
fi
[ "$doctor_rc" = 0 ] || verdict "doctor verdict" 0 "exit $doctor_rc: $(grep '^verdict' <<<"$doctor")"

section "one-worker job with the GPU watcher on"
job="$(RUST_LOG=muster=debug timeout 120 "$MUSTER" --standalone --nproc-per-node=1 --no-python \
    sh -c 'echo "worker: CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES CUDA_DEVICE_ORDER=$CUDA_DEVICE_ORDER"; sleep 3' 2>&1)"
job_rc=$?
grep -v 'DEBUG muster::store\|DEBUG.*rendezvous' <<<"$job"
watched="$(grep -c 'watching GPU gpu=' <<<"$job")"
verdict events "$([ "$watched" = "$n_gpus" ] && ! grep -q 'cannot register GPU events\|cannot watch GPU\|cannot create an NVML event set' <<<"$job" && echo 1)" \
    "$watched of $n_gpus GPU(s) registered for events: $(grep -o 'events=.*' <<<"$job" | sort | uniq -c | tr -s ' ' | tr '\n' ';')"
visible="$(sed -n 's/.*worker: CUDA_VISIBLE_DEVICES=\([^ ]*\) .*/\1/p' <<<"$job")"
verdict job "$([ "$job_rc" = 0 ] && [ -n "$visible" ] && echo 1)" "exit $job_rc, the worker saw CUDA_VISIBLE_DEVICES=$visible"

section "muster plan --nproc-per-node=gpu --numa-binding node (and exclusive)"
plan="$(timeout 60 "$MUSTER" plan --nproc-per-node=gpu --numa-binding node 2>&1)"
echo "$plan"
timeout 60 "$MUSTER" plan --nproc-per-node=gpu --numa-binding exclusive 2>&1
# topo -m: the header's columns before "CPU Affinity" are the link columns (GPUs, NICs); each GPU row is its
# name, one cell per link column, then CPU Affinity, NUMA Affinity, GPU NUMA ID.
links="$(awk '/CPU Affinity/ { n = 0; for (i = 1; i <= NF; i++) { if ($i == "CPU") break; n++ } print n; exit }' <<<"$topo")"
plan_ok=1
plan_detail=""
while read -r rank gpu uuid pci numa _link cpulist _rest; do
    topo_cpus="$(awk -v g="GPU$gpu" -v n="$links" '!/CPU Affinity/ && $1 == g { print $(n + 2); exit }' <<<"$topo")"
    topo_numa="$(awk -v g="GPU$gpu" -v n="$links" '!/CPU Affinity/ && $1 == g { print $(n + 3); exit }' <<<"$topo")"
    sys_pci="$(tr A-F a-f <<<"${pci#????}")"
    sys_numa="$(cat "${MUSTER_SYSFS_ROOT:-/sys}/bus/pci/devices/$sys_pci/numa_node" 2>/dev/null || echo "?")"
    [ "$sys_numa" = -1 ] && sys_numa=-
    [ "$topo_numa" = N/A ] && topo_numa=-
    ok=1
    [ "$numa" = "$sys_numa" ] || ok=0
    [ "$numa" = "$topo_numa" ] || ok=0
    [ "$(cpus "$cpulist")" = "$(cpus "$topo_cpus")" ] || ok=0
    [ "$ok" = 1 ] || plan_ok=0
    plan_detail+="rank $rank GPU $gpu ($pci): plan NUMA $numa CPUs $cpulist; topo NUMA $topo_numa CPUs $topo_cpus; sysfs NUMA $sys_numa. "
done < <(awk '$1 ~ /^[0-9]+$/ && $3 ~ /^(GPU|MIG)-/' <<<"$plan")
[ -n "$plan_detail" ] || plan_ok=0
verdict plan "$plan_ok" "${plan_detail:-no ranks planned}"

section "hang detection: the NCCL flight recorder (and, with \$MUSTER_PYTHON, a real NCCL hang)"
flight_dir="$(mktemp -d)"
flight="$(timeout 60 "$MUSTER" --standalone --nproc-per-node=1 --tee=3 --log-dir="$flight_dir" --hang-timeout=60 --no-python \
    sh -c 'echo "worker: TRACE=$TORCH_NCCL_TRACE_BUFFER_SIZE DUMP=$TORCH_NCCL_DUMP_ON_TIMEOUT FILE=$TORCH_NCCL_DEBUG_INFO_TEMP_FILE"' 2>&1)"
grep 'worker:' <<<"$flight"
flight_ok="$(grep -q "worker: TRACE=2000 DUMP=1 FILE=$flight_dir/.*/attempt_0/nccl_trace_rank_" <<<"$flight" && echo 1)"
verdict flight "${flight_ok:-0}" "$(grep -o 'TRACE=.*' <<<"$flight" | head -1)"
if [ -n "${MUSTER_PYTHON:-}" ] && [ "$n_gpus" -ge 2 ]; then
    cat >"$flight_dir/nccl_hang.py" <<'PY'
import os, time, torch, torch.distributed as dist
dist.init_process_group("nccl")
rank = dist.get_rank()
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
x = torch.ones(1 << 20, device="cuda")
for step in range(1000):
    if rank == 1 and step == 10:
        time.sleep(3600)
    print(f"step {step}", flush=True)
    dist.all_reduce(x)
    torch.cuda.synchronize()
PY
    nccl="$(PATH="$(dirname "$MUSTER_PYTHON"):$PATH" timeout 120 "$MUSTER" --standalone --nproc-per-node=2 \
        --log-dir="$flight_dir/nccl" --hang-timeout=10 --progress-pattern='step \d+' --on-hang=report \
        --metrics-port=0 "$flight_dir/nccl_hang.py" 2>&1 & pid=$!; sleep 45; kill -TERM "$pid"; wait "$pid")"
    grep 'hang: \|stacks written' <<<"$nccl"
    ls -R "$flight_dir/nccl" | grep -E 'rank_|nccl_trace' || true
    verdict "nccl hang" "$(grep -q 'hang: rank 1 ' <<<"$nccl" && echo 1)" "$(grep -o 'hang: .*' <<<"$nccl" | head -1)"
fi
rm -rf "$flight_dir"

exit "$failed"
