#!/usr/bin/env python3
"""Tokenization throughput, titan-rs vs Python `tokenizers` (the same Rust library's batch
encoding, as users call it), same file, same tokenizer, same cores, alternating rounds.

  python3 scripts/tokenize_bench.py FILE [ROUNDS] [TITAN_BINARY]

titan-rs: `titan-rs tokenizer encode FILE` into an empty cache (streaming: 1 MB batches of
64 KB pieces, written to the token file). Python: the file read whole, cut into the same
64 KB-ish pieces at newlines, `Tokenizer.encode_batch` on them (ids kept). Medians and ranges.
"""
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from tokenizers import Tokenizer

path = sys.argv[1]
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
here = os.path.dirname(os.path.abspath(__file__))
binary = sys.argv[3] if len(sys.argv) > 3 else os.path.join(here, "..", "target", "release", "titan-rs")
tok_path = os.path.join(here, "..", "assets", "tokenizer", "tokenizer.json")
size = os.path.getsize(path)


def python_once():
    tok = Tokenizer.from_file(tok_path)
    start = time.perf_counter()
    text = open(path, encoding="utf-8").read()
    pieces, i = [], 0
    while i < len(text):
        j = text.find("\n", i + 65536)
        j = len(text) if j < 0 else j + 1
        pieces.append(text[i:j])
        i = j
    n = 0
    for k in range(0, len(pieces), 16):
        n += sum(len(e.ids) for e in tok.encode_batch(pieces[k:k + 16], add_special_tokens=False))
    return time.perf_counter() - start, n


def titan_once():
    cache = tempfile.mkdtemp()
    try:
        start = time.perf_counter()
        out = subprocess.run([binary, "tokenizer", "encode", path, "--cache-dir", cache], capture_output=True, text=True, check=True).stdout
        secs = time.perf_counter() - start
        return secs, int(re.search(r": (\d+) tokens from", out).group(1))
    finally:
        shutil.rmtree(cache)


res = {"titan-rs": [], "python tokenizers": []}
for _ in range(rounds):
    for name, f in [("titan-rs", titan_once), ("python tokenizers", python_once)]:
        secs, n = f()
        res[name].append((secs, n))
for name, r in res.items():
    mbs = [size / 1e6 / s for s, _ in r]
    print(f"{name}: {statistics.median(mbs):.2f} MB/s [{min(mbs):.2f}-{max(mbs):.2f}], {r[0][1]} tokens, "
          f"{statistics.median([n / s for s, n in r]):.0f} tokens/s")
ratios = [p[0] / t[0] for t, p in zip(res["titan-rs"], res["python tokenizers"])]
print(f"same-round ratio titan-rs / python: {statistics.median(ratios):.2f}x [{min(ratios):.2f}-{max(ratios):.2f}]")
