"""The release `titan-rs` binary the benchmark scripts run (under $CARGO_TARGET_DIR or target/)."""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def binary():
    target = os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target"))
    path = os.path.join(target, "release", "titan-rs")
    if not os.path.exists(path):
        sys.exit(f"{path} not found; build it with `cargo build --release -p titan-rs`")
    return path
