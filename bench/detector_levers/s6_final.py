"""Final candidates: saved to work/, official mAP50-95 vs FP32 on 320 (with trtrepo's 95% bootstrap interval),
on each half (crops 0-159, 160-319), and over the 7 classes with >= 10 FP32 boxes."""
import json, re, time
import onnx
from common import *
from trtrepo.evaluate import compare_outputs
st = stats(True)
src = onnx.load(str(SRC)); prod = {o: n for n in src.graph.node for o in n.output}
R = {m: ranges_of(st, m) for m in ("percentile", "mse", "minmax")}
kind = lambda t: "pre" if t in prod and prod[t].op_type == "Conv" else "post"
mix = lambda pre, post: {t: (R[pre][t] if kind(t) == "pre" else R[post][t]) for t in R["percentile"]}
HEAD = (r"/model\.23/cv2\..*", r"/model\.23/cv3\..*")
C_ = {"default (percentile)": (mix("percentile", "percentile"), ()),
      "pre percentile + post mse": (mix("percentile", "mse"), ()),
      "pre percentile + post mse, Detect cv2/cv3 float": (mix("percentile", "mse"), HEAD),
      "pre percentile + post minmax, Detect cv2/cv3 float": (mix("percentile", "minmax"), HEAD)}
held, fp, det = reference(320)
out = {}
for i, (k, (rng, ex)) in enumerate(C_.items()):
    q = quantize(rng, options(exclude_nodes=ex)).model
    path = W / f"final_{i}.onnx"; onnx.save(q, str(path))
    y = run_model(q, held)
    f = compare_outputs({"output0": fp}, {"output0": y}, detection=det)["output0"].detection
    halves = []
    for lo, hi in ((0, 160), (160, 320)):
        from trtrepo.evaluate import Detector
        d = {"output0": Detector.of(fp[lo:hi], 80)}
        halves.append(compare_outputs({"output0": fp[lo:hi]}, {"output0": y[lo:hi]}, detection=d)["output0"].detection.map50_95)
    a, b = mAP2(q, 320)
    out[k] = dict(path=str(path), map320=f.map50_95, lower=f.lower, upper=f.upper, halves=halves, big=b)
    print(f"{k:55s} mAP320 {f.map50_95:.4f} [{f.lower:.3f}-{f.upper:.3f}] halves {halves[0]:.3f}/{halves[1]:.3f} big-classes {b:.4f}", flush=True)
json.dump(out, open(W / "s6.json", "w"), indent=1)
