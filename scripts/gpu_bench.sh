#!/usr/bin/env bash
# The GPU measurement, in the form a lent GPU machine can run (no registry, no Rust there): the
# bundle `scripts/gpu/package.sh` builds here (gpu-bundle/), run by its `run.sh`. On the device
# machine, from the repository root with `gpu-bundle` carried:
#
#   scripts/gpu_bench.sh            (= gpu-bundle/run.sh; the report lands in $OUT)
#   scripts/gpu_bench.sh --backend cuda   (burn's CUDA backend: gpu-bundle-cuda, from package.sh --cuda)
#   scripts/gpu_bench.sh --dry-run  (here, on Mesa's software adapter)
set -euo pipefail
bundle="$(dirname "$0")/../gpu-bundle"
# The CUDA bundle (`package.sh --cuda`) has its own folder.
case " $* " in *" cuda "*) bundle="$bundle-cuda" ;; esac
if [ ! -x "$bundle/run.sh" ]; then
    echo "error: no GPU bundle at $bundle; build it first with scripts/gpu/package.sh (on a machine with Rust), then carry gpu-bundle to the GPU machine" >&2
    exit 1
fi
exec "$bundle/run.sh" "$@"
