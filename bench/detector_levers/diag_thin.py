from common import *
held, fp, det = reference(320); D = det["output0"]
cls = np.concatenate([d.classes for d in D.reference]); sc = np.concatenate([d.scores for d in D.reference])
u, c = np.unique(cls, return_counts=True)
for k, v in zip(u, c):
    if v <= 3: print(f"class {k:3d} boxes {v} FP32 scores {np.round(sc[cls == k], 3).tolist()}")
print("all boxes: fraction with FP32 score < 0.35:", float(np.mean(sc < 0.35)).__round__(3), "of", len(sc))
