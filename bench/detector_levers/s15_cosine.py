"""What trtrepo's auto selection would see: output0 cosine (and mAP vs FP32) on its 51 held-out calibration crops, for A, C, D, E."""
from common import *
from trtrepo.autoquant.ranges import split_holdout
from trtrepo.evaluate import Detector, compare_outputs
idx = np.sort(np.random.default_rng(0).choice(256, size=51, replace=False))
x = np.ascontiguousarray(np.load(C / "calib.npy", mmap_mode="r")[idx])
fp = run_model(SRC, x); det = {"output0": Detector.of(fp, 80)}
for k, p in {"A default": "final_0.onnx", "C pre pct+post minmax": "final_5.onnx", "D": "final_6.onnx", "E": "final_3.onnx"}.items():
    m = compare_outputs({"output0": fp}, {"output0": run_model(W / p, x)}, detection=det)["output0"]
    print(f"{k:25s} cosine {m.cosine_mean:.6f} mAP(51 held-out calib crops) {m.detection.map50_95:.4f}", flush=True)
