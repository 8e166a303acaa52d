import sys
from common import *
from trtrepo.detect.nms import postprocess
from trtrepo.detect.judge import CANDIDATE_CONF, IOU
from trtrepo.detect.metrics import mean_ap
held, fp, det = reference(320)
D = det["output0"]
out = run_model(Path(sys.argv[1]), held)
np.save(W/"default_320.npy", out)
cand = postprocess(out, D.layout, conf=CANDIDATE_CONF, iou=IOU)
for lo, hi in ((0,160),(160,320),(0,320)):
    r = mean_ap(cand[lo:hi], D.reference[lo:hi]); print(lo, hi, "mAP", round(r.map50_95,4), "classes", r.classes)
r = mean_ap(cand, D.reference)
cls = np.concatenate([d.classes for d in D.reference]); u, c = np.unique(cls, return_counts=True); cnt = dict(zip(u.tolist(), c.tolist()))
for k, v in sorted(r.per_class.items(), key=lambda kv: kv[1]):
    print(f"class {k:3d} boxes {cnt[k]:4d} AP50-95 {v:.3f}")
