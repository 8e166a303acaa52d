"""Weight rounding that keeps a trained network's function: AdaRound, bias correction and
activation equalization, as pure numpy functions (no I/O, no ONNX); :mod:`trtrepo.weightsteps`
applies them to an ONNX model.

Every function works on one layer's weights in the *grouped matrix* layout ``W[G, Og, K]``: ``G``
groups (a Conv's ``group``; 1 for Gemm/MatMul), ``Og`` output channels per group and ``K`` inputs
per output (``Cin/G * kh * kw`` for a Conv). The per-output-channel scale is ``s[G, Og]``, the
symmetric grid ``[-qmax, qmax]`` of :func:`trtrepo.qdq.weight_qparams`.

Decisions:

* **The layer's input statistics are second moments.** A linear layer's squared output error for
  a weight change is ``d G d^T`` with ``G = sum x x^T`` over input patches, so AdaRound's
  reconstruction loss and its gradient need only ``G`` (``K x K`` per group), never the samples:
  memory and time per step are independent of the number of calibration samples.
* **Asymmetric reconstruction** (AdaRound, section 5): the rounded weights see the input as the
  quantized model sees it (the activation's own fake quantization), the target is the FP32
  output: loss ``||X W^T - Xq Ws^T||^2``, which needs ``Gqq = sum xq xq^T`` and
  ``Gxq = sum x xq^T``.
* **The grid does not move.** Each channel's largest-magnitude weight keeps its round-to-nearest
  value (``+-qmax``), so the scale the Q/DQ writer derives from the rounded weights is the scale
  AdaRound optimized against.
* **Never worse than rounding to nearest**: per layer the hard-rounded result is kept only where
  its reconstruction loss on the calibration statistics is below nearest rounding's.
* **Bias correction** subtracts the expected output shift ``Ws mu_q - W mu_x`` (input patch
  means, quantized and FP32), the empirical form of Nagel et al. 2019 section 4.2.
* **Activation equalization** (:func:`clip_safe_amplification`) lifts the small channels of a
  non-negative activation towards the large ones (producer channel divided by ``s_i <= 1``,
  consumer input channel multiplied by it): exact through ReLU, exact below ``clip / margin`` on
  the calibration data through ReLU6. DFQ's weight-range equalization is not here: with
  per-channel weight scales it leaves a depthwise layer's quantization unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

ROUNDING_STEPS = ("nearest", "bias_correction", "adaround")  # how quantize may round weights (no "auto")
ZETA, GAMMA = 1.1, -0.1  # the rectified sigmoid's stretch (AdaRound, eq. 23)


@dataclass
class InputMoments:
    """Second and first moments of one layer's input patches, accumulated over samples.

    ``x`` is the FP32 input as the FP32 network computes it, ``xq`` the same input after the
    activation's fake quantization (equal to ``x`` for an input that stays float)."""

    groups: int
    k: int
    gram_qq: np.ndarray = field(init=False)
    gram_xq: np.ndarray = field(init=False)
    gram_xx: np.ndarray = field(init=False)
    sum_x: np.ndarray = field(init=False)
    sum_q: np.ndarray = field(init=False)
    count: int = 0

    def __post_init__(self) -> None:
        self.gram_qq = np.zeros((self.groups, self.k, self.k), np.float64)
        self.gram_xq = np.zeros((self.groups, self.k, self.k), np.float64)
        self.gram_xx = np.zeros((self.groups, self.k, self.k), np.float64)
        self.sum_x = np.zeros((self.groups, self.k), np.float64)
        self.sum_q = np.zeros((self.groups, self.k), np.float64)

    def add(self, x: np.ndarray, xq: np.ndarray) -> None:
        """Add patches ``x``/``xq`` of shape ``[n, G, K]``."""
        if x.shape != xq.shape or x.ndim != 3 or x.shape[1:] != (self.groups, self.k):
            raise ValueError(f"patches of shape {x.shape} / {xq.shape}, expected [n, {self.groups}, {self.k}]")
        xt = np.ascontiguousarray(x.transpose(1, 2, 0), np.float32)  # [G, K, n]
        qt = np.ascontiguousarray(xq.transpose(1, 2, 0), np.float32)
        self.gram_qq += np.matmul(qt, qt.transpose(0, 2, 1))
        self.gram_xq += np.matmul(xt, qt.transpose(0, 2, 1))
        self.gram_xx += np.matmul(xt, xt.transpose(0, 2, 1))
        self.sum_x += x.sum(axis=0, dtype=np.float64)
        self.sum_q += xq.sum(axis=0, dtype=np.float64)
        self.count += x.shape[0]

    @property
    def mean_x(self) -> np.ndarray:
        return self.sum_x / max(self.count, 1)

    @property
    def mean_q(self) -> np.ndarray:
        return self.sum_q / max(self.count, 1)


def round_nearest(w: np.ndarray, scale: np.ndarray, qmax: float) -> np.ndarray:
    """Round-to-nearest integers of ``w[G, Og, K]`` on the grid ``scale[G, Og]``."""
    return np.clip(np.rint(w / _safe(scale)[..., None]), -qmax, qmax)


def _safe(scale: np.ndarray) -> np.ndarray:
    return np.where(scale > 0, scale, 1.0)


def reconstruction_loss(w: np.ndarray, ws: np.ndarray, m: InputMoments) -> np.ndarray:
    """Per group, the mean squared output error ``sum_n ||x W^T - xq Ws^T||^2 / n``."""
    n = max(m.count, 1)
    wq = ws.astype(np.float64)
    wf = w.astype(np.float64)
    quad = np.sum(np.matmul(wq, m.gram_qq) * wq, axis=(1, 2))
    cross = np.sum(np.matmul(wf, m.gram_xq) * wq, axis=(1, 2))
    const = np.sum(np.matmul(wf, m.gram_xx) * wf, axis=(1, 2))
    return np.maximum(quad - 2.0 * cross + const, 0.0) / n


@dataclass
class AdaRoundResult:
    q: np.ndarray  # integers [G, Og, K] (float array), on [-qmax, qmax]
    loss_nearest: float
    loss_adaround: float
    iterations: int
    kept_nearest: bool  # the learned rounding was no better: nearest rounding kept


def adaround(w: np.ndarray, scale: np.ndarray, m: InputMoments, *, qmax: float = 127.0, iterations: int = 1000,
             lr: float = 1e-2, reg: float = 0.01, beta: tuple[float, float] = (20.0, 2.0),
             warmup: float = 0.2) -> AdaRoundResult:
    """AdaRound (Nagel et al. 2020) for one layer: learn, per weight, whether to round down or up
    so that the layer's output on the calibration inputs stays closest to FP32.

    Adam on the rectified-sigmoid variable ``V``; loss = reconstruction (from the moments, see
    :class:`InputMoments`) + ``reg * sum(1 - |2h - 1|^beta)`` with ``beta`` annealed from
    ``beta[0]`` to ``beta[1]`` after ``warmup`` of the iterations (no regularization before).
    Full-batch and deterministic for given inputs. The gradient ``Ws Gqq - W Gxq`` is a small
    difference of large terms, so it is computed as ``s (q - W/s) Gqq + W (Gqq - Gxq)``: the
    constant term once in float64, the varying one from the rounding offset ``q - W/s`` (at most
    one grid step), where float32 loses nothing to cancellation. The iteration then runs in float32
    (numpy's float32 exp and sqrt are SIMD, float64's are not here: about 5x faster per step);
    float32 on the plain form ``Ws Gqq - W Gxq`` had lost 1.4 points of top-1 agreement on the
    trained MobileNetV2 (docs/benchmarks.md, "Issue 26")."""
    f32 = np.float32
    w = np.asarray(w, np.float64)
    s64 = _safe(np.asarray(scale, np.float64))[..., None]  # [G, Og, 1]
    n = max(m.count, 1)
    gqq = (m.gram_qq / n).astype(f32)
    const = np.matmul(w, (m.gram_qq - m.gram_xq) / n).astype(f32)  # W (Gqq - Gxq)
    ratio64 = w / s64
    floor64 = np.floor(ratio64)
    rest = np.clip(ratio64 - floor64, 1e-4, 1 - 1e-4)
    # h(V) = clip(sigmoid(V) * (ZETA - GAMMA) + GAMMA, 0, 1); start where h = the fractional part
    v = (-np.log((ZETA - GAMMA) / (rest - GAMMA) - 1.0)).astype(f32)
    m1 = np.zeros_like(v)
    m2 = np.zeros_like(v)
    b1, b2, eps = 0.9, 0.999, 1e-8
    n_warm = int(warmup * iterations)
    # The channel's largest weight keeps its nearest value (the grid's scale stays put).
    amax_idx = np.abs(ratio64).reshape(-1, ratio64.shape[-1]).argmax(axis=1)
    pin = np.zeros(ratio64.shape, bool).reshape(-1, ratio64.shape[-1])
    pin[np.arange(pin.shape[0]), amax_idx] = True
    pin = pin.reshape(ratio64.shape)
    nearest = round_nearest(w, s64[..., 0], qmax)
    s, ratio, floor = s64.astype(f32), ratio64.astype(f32), floor64.astype(f32)
    pinned_offset = (nearest - ratio64).astype(f32)  # q - W/s of the pinned weights
    lo, hi = f32(-qmax), f32(qmax)
    for it in range(iterations):
        sig = f32(1.0) / (f32(1.0) + np.exp(-v))
        h_raw = sig * f32(ZETA - GAMMA) + f32(GAMMA)
        h = np.clip(h_raw, f32(0.0), f32(1.0))
        qf = floor + h
        inside = (qf >= lo) & (qf <= hi) & ~pin
        offset = np.where(pin, pinned_offset, np.clip(qf, lo, hi) - ratio)  # q - W/s
        grad_ws = f32(2.0) * (np.matmul(s * offset, gqq) + const)
        grad_h = grad_ws * s * inside
        if it >= n_warm:
            frac = (it - n_warm) / max(iterations - n_warm, 1)
            b = beta[1] + 0.5 * (beta[0] - beta[1]) * (1 + np.cos(np.pi * frac))
            t = f32(2.0) * h - f32(1.0)
            with np.errstate(divide="ignore"):
                power = np.exp(f32(b - 1.0) * np.log(np.abs(t)))  # |t|^(b-1), b >= 2
            grad_h = grad_h + f32(reg) * (f32(-2.0 * b) * power * np.sign(t))
        grad_v = grad_h * ((h_raw > 0) & (h_raw < 1)) * sig * (f32(1.0) - sig) * f32(ZETA - GAMMA)
        m1 = f32(b1) * m1 + f32(1 - b1) * grad_v
        m2 = f32(b2) * m2 + f32(1 - b2) * grad_v * grad_v
        v -= f32(lr) * (m1 / f32(1 - b1 ** (it + 1))) / (np.sqrt(m2 / f32(1 - b2 ** (it + 1))) + f32(eps))
    q = np.clip(floor64 + (v >= 0), -qmax, qmax)
    q = np.where(pin, nearest, q)
    w32 = w.astype(np.float32)
    loss_near = float(reconstruction_loss(w32, (s64 * nearest).astype(np.float32), m).sum())
    loss_ada = float(reconstruction_loss(w32, (s64 * q).astype(np.float32), m).sum())
    if loss_ada >= loss_near:
        return AdaRoundResult(nearest, loss_near, loss_ada, iterations, True)
    return AdaRoundResult(q, loss_near, loss_ada, iterations, False)


def bias_shift(w: np.ndarray, ws: np.ndarray, m: InputMoments) -> np.ndarray:
    """The expected output shift ``Ws mu_q - W mu_x`` per output channel, ``[G, Og]``: subtract it
    from the bias to correct the quantized layer's mean output (bias correction)."""
    return (np.einsum("gok,gk->go", ws.astype(np.float64), m.mean_q)
            - np.einsum("gok,gk->go", w.astype(np.float64), m.mean_x))


def clip_safe_amplification(channel_max: np.ndarray, *, clip: float | None, quantile: float = 99.0,
                            margin: float = 4.0) -> np.ndarray:
    """Per-channel scales ``s_i <= 1`` that lift the small channels of a non-negative activation
    (after ReLU or ReLU6) towards the large ones, for per-tensor activation quantization: the
    producer's channel ``i`` is divided by ``s_i`` (amplified), the consumer's input channel ``i``
    multiplied by it.

    ``channel_max``: each channel's largest pre-activation value on the calibration data. Target:
    the ``quantile`` of the channels' post-activation ranges. ReLU (``clip=None``) is positively
    homogeneous, so any amplification keeps the function. A clip ``c`` (ReLU6) keeps it exactly
    while the amplified input stays below ``c``: an amplified channel may reach at most
    ``c / margin`` on the calibration data, so an unseen input keeps the function up to
    ``margin`` times the largest value calibration saw. Dead channels (max <= 0) keep scale 1."""
    m = np.maximum(np.asarray(channel_max, np.float64), 0.0)
    r = m if clip is None else np.minimum(m, clip)
    live = r > 1e-12
    if not np.any(live):
        return np.ones_like(m)
    target = float(np.percentile(r[live], quantile))
    s = np.ones_like(m)
    s[live] = np.minimum(r[live] / target, 1.0)
    if clip is not None:
        s[live] = np.maximum(s[live], m[live] * margin / clip)
    return np.minimum(s, 1.0)
