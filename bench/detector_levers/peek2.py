from common import *
st = stats(True)
r = {m: ranges_of(st, m) for m in ("percentile", "minmax", "mse", "entropy")}
print("images", {m: (round(r[m]["images"].amax,4), r[m]["images"].lo, r[m]["images"].hi) for m in r})
names = list(r["percentile"])
rat = np.array([r["percentile"][n].amax / max(r["minmax"][n].amax, 1e-12) for n in names])
print("percentile/minmax amax ratio quantiles", np.quantile(rat, [0, .1, .25, .5, .75, .9, 1]).round(3))
neg = [(n, r["minmax"][n].lo, r["minmax"][n].hi, r["percentile"][n].amax) for n in names]
# tensors whose lo is strongly negative vs hi, amax clips hi
for n, lo, hi, a in sorted(neg, key=lambda t: t[3] / max(t[2], 1e-9))[:15]:
    print(f"{n:70s} lo {lo:9.3f} hi {hi:9.3f} pct-amax {a:8.3f} mse {r['mse'][n].amax:8.3f}")
