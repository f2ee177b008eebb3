#!/usr/bin/env bash
# What runs on a lent GPU machine, from the bundle `scripts/gpu/package.sh` makes: unpacks the
# binary, brings the Vulkan loaders when the machine has none (as the device README says), lists
# the adapters, then — each step under a hard time limit, the whole under 8 minutes —
#   1. `bench kernels`: every kernel checked against its reference, then timed against the
#      ceilings (H200: 4 300 GB/s, 790 TFLOP/s);
#   2. `bench train` on the `small` flavor in float32 and in bfloat16 (float16 where the adapter
#      has no bfloat16): tokens/s and MFU.
# Writes $OUT/report.json and $OUT/report.md (and $OUT/run.log with every step's output); a step
# that fails or runs out of time is recorded in both, never a silent stop.
#
#   run.sh             on the GPU machine ($OUT: the device tool's output folder)
#   run.sh --dry-run   here, on Mesa's software adapter, tiny shapes: proves the bundle runs alone
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
DRY=0
[ "${1:-}" = "--dry-run" ] && DRY=1
OUT=${OUT:-$HERE/out}
mkdir -p "$OUT"
LOG="$OUT/run.log"
: > "$LOG"
export XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-/tmp}"
export RUST_LOG="${RUST_LOG:-warn}"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
STEPS_JSON=""
FAILED=""

# step NAME SECONDS CMD...: runs CMD (in the bundle folder) under a time limit, appends its output
# to the log, and records its exit status (124: out of time).
step() {
    local name=$1 limit=$2
    shift 2
    local start end status
    start=$(date +%s)
    echo "=== $name (limit ${limit}s): $*" >> "$LOG"
    (cd "$HERE" && timeout --kill-after=10 "$limit" "$@") >> "$LOG" 2>&1
    status=$?
    end=$(date +%s)
    echo "=== $name: exit $status after $((end - start)) s" >> "$LOG"
    STEPS_JSON="$STEPS_JSON${STEPS_JSON:+,}{\"name\": \"$name\", \"exit\": $status, \"seconds\": $((end - start)), \"limit\": $limit}"
    if [ "$status" -ne 0 ]; then
        local why="exit $status"
        [ "$status" -eq 124 ] && why="out of time (${limit} s)"
        FAILED="$FAILED- **$name**: $why; the end of its output:\n\n\`\`\`\n$(sed -n "/^=== $name (limit/,/^=== $name: exit/p" "$LOG" | tail -15)\n\`\`\`\n"
    fi
    return "$status"
}

if ! xz -dc "$HERE/titan-rs.xz" > "$WORK/titan-rs" 2>> "$LOG"; then
    echo "cannot unpack $HERE/titan-rs.xz" | tee -a "$LOG" >&2
fi
chmod +x "$WORK/titan-rs"
BIN="$WORK/titan-rs"

# The loaders: the machine's own libvulkan, else the carried packages (never on a dry run: this
# machine's / is not ours to change).
if ! ldconfig -p 2>/dev/null | grep -q 'libvulkan\.so\.1'; then
    if [ "$DRY" -eq 0 ] && ls "$HERE"/debs/*.deb >/dev/null 2>&1; then
        for f in "$HERE"/debs/*.deb; do dpkg -x "$f" /; done
        ldconfig
        echo "unpacked the carried loaders: $(ls "$HERE/debs" | tr '\n' ' ')" >> "$LOG"
    else
        echo "no libvulkan on this machine and no carried loaders used" >> "$LOG"
    fi
fi
NV_ICD=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
step devices 60 "$BIN" devices --json "$WORK/devices.json"
if [ "$DRY" -eq 0 ] && ! grep -q '"kind": "discrete GPU"' "$WORK/devices.json" 2>/dev/null && [ -f "$NV_ICD" ]; then
    # No GPU adapter through the default ICDs: point the loader at NVIDIA's (device README).
    export VK_DRIVER_FILES=$NV_ICD
    export __EGL_VENDOR_LIBRARY_FILENAMES=/usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json
    step devices-nvidia-icd 60 "$BIN" devices --json "$WORK/devices.json"
fi

if [ "$DRY" -eq 1 ]; then
    SHAPE="--config configs/llama_debug.toml --model.flavor tiny --training.local_batch_size 2 --training.seq_len 32"
    KITERS=1; TRAIN="--warmup 1 --steps 2"; KLIMIT=240; TLIMIT=120
else
    SHAPE="--config configs/llama_small.toml --model.flavor small --training.local_batch_size 8 --training.seq_len 2048"
    KITERS=10; TRAIN="--warmup 1 --steps 3"; KLIMIT=150; TLIMIT=120
fi
COMMON="--training.device wgpu --parallelism.data_parallel_shard_degree 1 --checkpoint.enable false"
step kernels "$KLIMIT" "$BIN" bench kernels $SHAPE $COMMON --iters "$KITERS" --peak-gbs 4300 --peak-tflops 790 \
    --json "$WORK/kernels.json"
step train-float32 "$TLIMIT" "$BIN" bench train $SHAPE $COMMON $TRAIN --metrics.peak_tflops 790 \
    --json "$WORK/train-float32.json"
HALF=bfloat16
if ! grep -A12 '"chosen": true' "$WORK/devices.json" 2>/dev/null | grep -q '"bfloat16": true'; then
    HALF=float16
    echo "the adapter does not compute in bfloat16: the half-precision run uses float16" >> "$LOG"
fi
step "train-$HALF" "$TLIMIT" "$BIN" bench train $SHAPE $COMMON $TRAIN --metrics.peak_tflops 790 \
    --training.mixed_precision_param "$HALF" --json "$WORK/train-$HALF.json"

json_or_null() { if [ -s "$1" ]; then cat "$1"; else echo null; fi; }
{
    echo "{"
    echo "  \"dry_run\": $([ "$DRY" -eq 1 ] && echo true || echo false),"
    echo "  \"date\": \"$(date -u +%Y-%m-%dT%H:%M:%SZ)\","
    echo "  \"host\": \"$(uname -srm)\","
    echo "  \"steps\": [$STEPS_JSON],"
    echo "  \"devices\": $(json_or_null "$WORK/devices.json"),"
    echo "  \"kernels\": $(json_or_null "$WORK/kernels.json"),"
    echo "  \"train\": {\"float32\": $(json_or_null "$WORK/train-float32.json"), \"$HALF\": $(json_or_null "$WORK/train-$HALF.json")}"
    echo "}"
} > "$OUT/report.json"

section() { sed -n "/^=== $1 (limit/,/^=== $1: exit/p" "$LOG" | grep '^|' ; }
{
    echo "# titan-rs GPU report$([ "$DRY" -eq 1 ] && echo " (dry run on this machine's software adapter)")"
    echo
    echo "$(date -u +%Y-%m-%dT%H:%M:%SZ), $(uname -srm)"
    echo
    echo "## Adapters"
    echo
    section devices-nvidia-icd || section devices
    echo
    echo "## Kernels (checked against the reference, then timed; ceilings 4 300 GB/s, 790 TFLOP/s)"
    echo
    section kernels
    echo
    echo "## Training steps ($([ "$DRY" -eq 1 ] && echo "tiny flavor, 2 × 32 tokens" || echo "small flavor, 8 × 2048 tokens"))"
    echo
    echo "float32:"
    echo
    section train-float32
    echo
    echo "$HALF:"
    echo
    section "train-$HALF"
    echo
    echo "## Failures"
    echo
    if [ -n "$FAILED" ]; then printf '%b' "$FAILED"; else echo "none"; fi
} > "$OUT/report.md"
echo "report: $OUT/report.md, $OUT/report.json"
[ -z "$FAILED" ]
