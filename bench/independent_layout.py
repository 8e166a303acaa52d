"""Issue 17: at concurrency 16 validate reads more than the independent client of
``tests/test_validate.py``; is it the independent client's layout (its threads spread over 4
processes on the server's own cores)?

One server (the demo CNN, FP32 ONNX in the Python backend, the default config). Each round, in
rotating order: validate's level at ``--concurrency`` (2 s windows until three agree) and the
independent client with its threads in 4, 2 and 1 processes (``--seconds`` each, the second half
counted). Reported: each reading per round, the median, and the median ratio validate / that.

    python bench/independent_layout.py --rounds 5 [--concurrency 16]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))

from _common import cpu_name, served_fp32  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=10.0)
    args = ap.parse_args()

    from test_validate import _plain_client_loop  # the independent client, as the test writes it
    from tune_search import models

    from trtrepo.cpu import available_cores

    t0 = time.time()
    kinds = ["validate", "4 processes", "2 processes", "1 process"]
    res: dict[str, list[float]] = {k: [] for k in kinds}
    with tempfile.TemporaryDirectory(prefix="trtrepo-bench-layout-") as tmp:
        root = Path(tmp)
        ((_label, (onnx_path, data)),) = models(root, ["demo"]).items()
        with served_fp32(root / "repo", onnx_path, data) as served:
            for r in range(args.rounds):
                for k in kinds[r % 4:] + kinds[:r % 4]:
                    if k == "validate":
                        v = served.level(args.concurrency)["throughput"]
                    else:
                        v = _plain_client_loop(served.server.grpc_url, served.payloads, args.concurrency, args.seconds,
                                               processes=int(k.split()[0]))
                    res[k].append(v)
                    print(f"round {r + 1} {k}: {v:.1f} infer/s", file=sys.stderr, flush=True)
    print(f"Command: `python bench/independent_layout.py --rounds {args.rounds} --concurrency {args.concurrency}`. "
          f"CPU: {cpu_name()}, {available_cores()} cores; {time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC; "
          f"{time.time() - t0:.0f} s.\n")
    print("| client | infer/s per round | median | median ratio validate / this |")
    print("|---|---|---:|---:|")
    for k, v in res.items():
        ratio = statistics.median(a / b for a, b in zip(res["validate"], v, strict=True))
        print(f"| {k} | {', '.join(f'{x:.0f}' for x in v)} | {statistics.median(v):.0f} | {ratio:.2f} |")


if __name__ == "__main__":
    main()
