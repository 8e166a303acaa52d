"""Speed at batch 8, ONNX Runtime CPU, 2 threads, round-robin, median of 11 (bench/detector.py speeds())."""
import json, time
from common import *
from detector import speeds
held, fp, det = reference(160)
M = {"FP32": SRC, "default INT8 (percentile)": W / "final_0.onnx", "pre pct + post mse (all INT8)": W / "final_1.onnx",
     "pre pct + post mse, cv2/cv3 float": W / "final_2.onnx", "pre pct + post minmax, cv2/cv3 float": W / "final_3.onnx", "pre pct + post mse, cv2/cv3 scales 1-2 float": W / "final_4.onnx"}
s = speeds({k: Path(v) for k, v in M.items()}, np.ascontiguousarray(held[:8]), rounds=11)
for k, v in s.items(): print(f"{k:40s} {v*1000:7.1f} ms/batch8  FP32/this {s['FP32']/v:.2f}x", flush=True)
json.dump(s, open(W / "s7.json", "w"), indent=1)
