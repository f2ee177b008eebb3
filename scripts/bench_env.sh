# Sourced by the bench scripts: ROUNDS and STEPS from the arguments, the binary, a scratch
# folder removed on exit.
ROUNDS=${1:-2}
STEPS=${2:-3}
BIN=${TITAN_RS:-${CARGO_TARGET_DIR:-target}/release/titan-rs}
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
