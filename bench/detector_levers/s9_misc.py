from common import *
for p in ("bcseq_percentile_48.onnx",):
    a, b = mAP2(W / p, 320); print(p, f"mAP320 {a:.4f} big-classes {b:.4f}", flush=True)
