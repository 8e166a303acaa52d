import time, json
from common import *
t=time.time()
print("existing all-INT8 (trtrepo default, percentile):", mAP(Path("/tmp/trtrepo-detector/all-INT8.onnx")), time.time()-t, flush=True)
st = stats(True); print("stats", time.time()-t, flush=True)
res = {}
for m in ("percentile", "minmax", "entropy", "mse"):
    q = quantize(ranges_of(st, m))
    res[m] = mAP(q.model); print(m, res[m], len(q.plan.excluded) if hasattr(q.plan,'excluded') else '', time.time()-t, flush=True)
json.dump(res, open("work/s1.json","w"))
