"""Benchmark: peak memory of ``Calibrator(model, data, batch_size=B).collect()`` against the batch
size, with the memory budget (default 512 MB) and without it (``memory_budget_mb=None``, whole
batches as before the budget), on all-mpnet-base-v2 (the gauntlet's ONNX export).

Data: ``--sentences`` (128) English-like sentences of 4 to 60 words generated from a fixed seed,
tokenized with the model's own tokenizer (``transformers.AutoTokenizer``, local files only) and
padded to the longest, so that every batch is full; ``input_ids`` and ``attention_mask`` int64
in an .npz that the calibrator reads as its data spec.

Every run is a fresh subprocess. Reported per run: wall time of ``collect()``, the process's peak
RSS (``VmHWM``, session build included), the growth of RSS during ``collect()`` (peak after the
session is built minus the RSS then; memory the session build freed is reused first, so this
understates), and whether its TensorRT cache (entropy) and ranges JSON are
byte-identical to batch size 1 with the same budget and to the run without a budget at the same
batch size.

    python bench/calib_memory.py [--model /work/gauntlet-cache/mpnet/model.onnx]
        [--batch-sizes 1 16 32 64] [--budgets 512 none] [--sentences 128]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import status_mb

CACHE = Path("/work/gauntlet-cache/mpnet")

_WORDS = (
    "the a one every some this that my your our model data sentence text vector embedding search query answer "
    "question river mountain city market school garden window engine signal network layer weight value range "
    "quickly slowly often never always carefully quietly brightly red green small large ancient modern simple "
    "complex runs reads writes builds measures computes finds keeps moves turns opens closes holds shows brings "
    "under over through between across after before during without within against toward beside around"
).split()


def sentences(n: int, seed: int = 0) -> list[str]:
    """``n`` deterministic sentences of 4 to 60 words (varied lengths, a few long ones)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        length = int(rng.integers(4, 61)) if i % 8 else int(rng.integers(40, 61))
        words = [_WORDS[j] for j in rng.integers(0, len(_WORDS), length)]
        out.append(" ".join(words).capitalize() + ".")
    return out


def make_data(model: Path, tokenizer_dir: Path, n: int, path: Path) -> tuple[int, int]:
    import numpy as np
    import onnx
    from transformers import AutoTokenizer

    inputs = [i.name for i in onnx.load(str(model), load_external_data=False).graph.input]
    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir), local_files_only=True)
    enc = tok(sentences(n), padding="longest", truncation=True, max_length=384, return_tensors="np")
    arrays = {name: np.ascontiguousarray(enc[name], dtype=np.int64) for name in inputs}
    np.savez(path, **arrays)
    return arrays[inputs[0]].shape


def worker(model: str, data: str, batch_size: int, budget: float | None, out: str) -> dict:
    from trtrepo.calibrate import Calibrator

    cal = Calibrator(model, data, batch_size=batch_size, progress=False, memory_budget_mb=budget)
    cal.session  # noqa: B018 - built before the baseline
    hwm_before = status_mb("VmHWM")
    base = status_mb("VmRSS")
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # VmHWM := VmRSS, so the peak below is collect()'s own
    except OSError:
        pass
    start = time.perf_counter()
    stats = cal.collect()
    took = time.perf_counter() - start
    hwm = status_mb("VmHWM")
    ranges = stats.compute("entropy")
    ranges.write_cache(out + ".cache")
    ranges.save_json(out + ".json", stats)
    return {"batch_size": batch_size, "budget": budget, "seconds": took, "peak_rss_mb": max(hwm, hwm_before),
            "growth_mb": hwm - base, "groups": len(cal._groups or [cal.tensors]),
            # Fetched bytes of one sample (measured with a budget only).
            "fetched_mb_per_sample": max((sum(v.values()) for v in cal._bytes.values()), default=0) / 2**20,
            "independent": sorted(n for n, v in cal._independent.items() if v), "tensors": len(stats)}


def run_one(model: Path, data: Path, batch_size: int, budget: float | None, out: Path) -> dict:
    cmd = [sys.executable, __file__, "--worker", "--model", str(model), "--data", str(data), "--batch-sizes", str(batch_size),
           "--budgets", "none" if budget is None else str(budget), "--out", str(out)]
    res = subprocess.run(cmd, capture_output=True, text=True, check=False, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    if res.returncode != 0:
        raise SystemExit(f"worker failed:\n{res.stderr[-3000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, default=CACHE / "model.onnx")
    ap.add_argument("--tokenizer", type=Path, default=None, help="tokenizer folder [default: next to the model]")
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 16, 32, 64])
    ap.add_argument("--budgets", nargs="+", default=["512", "none"], help="MB, or 'none' for whole batches")
    ap.add_argument("--sentences", type=int, default=128)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--data", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--out", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    budgets = [None if b == "none" else float(b) for b in args.budgets]
    if args.worker:
        print(json.dumps(worker(str(args.model), args.data, args.batch_sizes[0], budgets[0], args.out)))
        return
    if not args.model.is_file():
        raise SystemExit(f"{args.model}: not found (the gauntlet's mpnet export)")
    tok_dir = args.tokenizer
    if tok_dir is None:
        found = sorted(p.parent for p in args.model.parent.rglob("tokenizer.json"))
        tok_dir = found[0] if found else args.model.parent
    with tempfile.TemporaryDirectory(prefix="calib-memory-") as tmp:
        data = Path(tmp) / "sentences.npz"
        shape = make_data(args.model, tok_dir, args.sentences, data)
        print(f"model {args.model}, {shape[0]} sentences padded to {shape[1]} tokens", flush=True)
        rows = []
        for budget in budgets:
            for bs in args.batch_sizes:
                out = Path(tmp) / f"{budget}-{bs}"
                row = run_one(args.model, data, bs, budget, out)
                row["cache"] = (out.parent / (out.name + ".cache")).read_bytes()
                row["json"] = (out.parent / (out.name + ".json")).read_bytes()
                rows.append(row)
                print(f"  budget {budget or 'none':>5} MB  batch {bs:>3}: {row['seconds']:6.1f} s  peak RSS "
                      f"{row['peak_rss_mb']:7.0f} MB  growth in collect {row['growth_mb']:7.0f} MB  groups {row['groups']}",
                      flush=True)
        print(f"\n{'budget MB':>9} {'batch':>5} {'seconds':>8} {'peak RSS MB':>11} {'growth MB':>9} "
              f"{'cache == bs 1':>13} {'json == bs 1':>12} {'cache == none':>13} {'json == none':>12}")
        for row in rows:
            first = next(r for r in rows if r["budget"] == row["budget"] and r["batch_size"] == args.batch_sizes[0])
            whole = next((r for r in rows if r["budget"] is None and r["batch_size"] == row["batch_size"]), None)
            print(f"{row['budget'] or 'none':>9} {row['batch_size']:>5} {row['seconds']:8.1f} {row['peak_rss_mb']:11.0f} "
                  f"{row['growth_mb']:9.0f} {str(row['cache'] == first['cache']):>13} {str(row['json'] == first['json']):>12} "
                  f"{'-' if whole is None else str(row['cache'] == whole['cache']):>13} "
                  f"{'-' if whole is None else str(row['json'] == whole['json']):>12}")
        per_sample = max(r["fetched_mb_per_sample"] for r in rows)
        print(f"\n{rows[0]['tensors']} tensors, {per_sample:.0f} MB fetched per sample; batch-independent: "
              f"{', '.join(rows[-1]['independent']) or 'none found'}")


if __name__ == "__main__":
    main()
