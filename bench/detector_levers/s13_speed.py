"""Speed at batch 8, ONNX Runtime CPU, 2 threads, round-robin in one process, median of 15 (bench/detector.py speeds())."""
import json
from common import *
from detector import speeds
x = np.ascontiguousarray(np.load(C / "eval.npy", mmap_mode="r")[:8])
M = {"FP32": SRC, "default INT8 (percentile)": W / "final_0.onnx",
     "pre pct + post minmax (all INT8)": W / "final_5.onnx",
     "pre pct + post minmax, cv2/cv3 scales 1-2 float": W / "final_6.onnx",
     "pre pct + post minmax, cv2/cv3 float": W / "final_3.onnx"}
s = speeds({k: Path(v) for k, v in M.items()}, x, rounds=15)
for k, v in s.items(): print(f"{k:50s} {v*1000:7.1f} ms/batch8  FP32/this {s['FP32']/v:.2f}x", flush=True)
json.dump(s, open(W / "s13.json", "w"), indent=1)
