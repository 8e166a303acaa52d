"""Benchmark: peak memory of ``Calibrator(model, data, batch_size=B).collect()`` against the batch
size, with the memory budget (default 512 MB; ``--budgets 512 none`` adds runs without it, whole
batches as before the budget), on all-mpnet-base-v2 (the gauntlet's ONNX export, 436 MB of
weights embedded in the file).

Data: ``--sentences`` (128) English-like sentences of 4 to 60 words generated from a fixed seed,
tokenized with the model's own tokenizer (``transformers.AutoTokenizer``, local files only) and
padded to the longest, so that every batch is full; ``input_ids`` and ``attention_mask`` int64
in an .npz that the calibrator reads as its data spec.

Every run is a fresh subprocess. Reported per run: the time to build the calibrator and its
session (imports included) and the time of ``collect()``; the process's peak RSS (``VmHWM``:
interpreter, imports, model, session build and ``collect()``) and its peak before ``collect()``
(``build peak``); the growth of RSS during ``collect()`` (peak after the session is built minus
the RSS then); whether its TensorRT cache (entropy) and ranges JSON are byte-identical to the
first batch size with the same budget (``== bs``), to the run without a budget at the same batch
size (``== none``) and to the same run saved by an earlier ``--save`` (``== ref``, e.g. of the code
before a change: ``--save DIR`` there, ``--reference DIR`` here).

    python bench/calib_memory.py [--model /work/gauntlet-cache/mpnet/model.onnx]
        [--batch-sizes 1 16 32 64] [--budgets 512 none] [--sentences 128] [--save DIR] [--reference DIR]
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
    start = time.perf_counter()
    from trtrepo.calibrate import Calibrator

    cal = Calibrator(model, data, batch_size=batch_size, progress=False, memory_budget_mb=budget)
    cal.session  # noqa: B018 - built before the baseline
    built = time.perf_counter()
    hwm_before = status_mb("VmHWM")
    base = status_mb("VmRSS")
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # VmHWM := VmRSS, so the peak below is collect()'s own
    except OSError:
        pass
    stats = cal.collect()
    took = time.perf_counter() - built
    hwm = status_mb("VmHWM")
    ranges = stats.compute("entropy")
    ranges.write_cache(out + ".cache")
    ranges.save_json(out + ".json", stats)
    return {"batch_size": batch_size, "budget": budget, "seconds": took, "build_seconds": built - start,
            "peak_rss_mb": max(hwm, hwm_before), "build_peak_mb": hwm_before,
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
    ap.add_argument("--budgets", nargs="+", default=["512"], help="MB, or 'none' for whole batches")
    ap.add_argument("--sentences", type=int, default=128)
    ap.add_argument("--save", type=Path, default=None, help="keep every run's cache and ranges JSON in this folder")
    ap.add_argument("--reference", type=Path, default=None,
                    help="a --save folder of an earlier run (e.g. before a change): compare the outputs byte for byte")
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
    if args.save is not None:
        args.save.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="calib-memory-") as tmp:
        data = Path(tmp) / "sentences.npz"
        shape = make_data(args.model, tok_dir, args.sentences, data)
        print(f"model {args.model} ({args.model.stat().st_size / 2**20:.0f} MB), {shape[0]} sentences padded to "
              f"{shape[1]} tokens", flush=True)
        rows = []
        for budget in budgets:
            for bs in args.batch_sizes:
                tag = f"{'none' if budget is None else f'{budget:g}'}-{bs}"
                out = (args.save or Path(tmp)) / tag
                row = run_one(args.model, data, bs, budget, out)
                row["cache"] = out.with_name(tag + ".cache").read_bytes()
                row["json"] = out.with_name(tag + ".json").read_bytes()
                if args.reference is not None:
                    ref = args.reference / tag
                    row["ref"] = (None if not ref.with_name(tag + ".cache").is_file() else
                                  (row["cache"] == ref.with_name(tag + ".cache").read_bytes()
                                   and row["json"] == ref.with_name(tag + ".json").read_bytes()))
                rows.append(row)
                print(f"  budget {budget or 'none':>5} MB  batch {bs:>3}: build {row['build_seconds']:5.1f} s  collect "
                      f"{row['seconds']:6.1f} s  peak RSS {row['peak_rss_mb']:6.0f} MB (build {row['build_peak_mb']:6.0f})"
                      f"  growth in collect {row['growth_mb']:6.0f} MB  groups {row['groups']}", flush=True)

        def yes(value: bool | None) -> str:
            return "-" if value is None else "yes" if value else "NO"

        print(f"\n{'budget MB':>9} {'batch':>5} {'build s':>7} {'collect s':>9} {'peak RSS MB':>11} {'build peak':>10} "
              f"{'growth MB':>9} {'== bs ' + str(args.batch_sizes[0]):>8} {'== none':>7} {'== ref':>6}")
        for row in rows:
            first = next(r for r in rows if r["budget"] == row["budget"] and r["batch_size"] == args.batch_sizes[0])
            whole = next((r for r in rows if r["budget"] is None and r["batch_size"] == row["batch_size"]), None)
            print(f"{row['budget'] or 'none':>9} {row['batch_size']:>5} {row['build_seconds']:7.1f} {row['seconds']:9.1f} "
                  f"{row['peak_rss_mb']:11.0f} {row['build_peak_mb']:10.0f} {row['growth_mb']:9.0f} "
                  f"{yes(row['cache'] == first['cache'] and row['json'] == first['json']):>8} "
                  f"{yes(None if whole is None else row['cache'] == whole['cache'] and row['json'] == whole['json']):>7} "
                  f"{yes(row.get('ref')):>6}")
        per_sample = max(r["fetched_mb_per_sample"] for r in rows)
        print(f"\n{rows[0]['tensors']} tensors, {per_sample:.0f} MB fetched per sample; batch-independent: "
              f"{', '.join(rows[-1]['independent']) or 'none found'}; '==' columns: cache and ranges JSON byte-identical")

if __name__ == "__main__":
    main()
