import numpy as np
np.set_printoptions(precision=17)
X = 9.0
x = np.concatenate([np.linspace(1e-4, X, 20000)])
y = np.tanh(x)
u = x * x
def fit(npn, nq, iters=200):
    # tanh(x) ~ x * P(u) / Q(u), Q(0)=1. Linearized: x P(u) - y (Q(u)-1) = y, weighted by 1/Q_prev (SK) and relative error.
    Qprev = np.ones_like(x)
    w_extra = np.ones_like(x)
    for it in range(iters):
        A = np.concatenate([np.stack([x * u**i for i in range(npn)], 1), np.stack([-y * u**j for j in range(1, nq + 1)], 1)], 1)
        w = w_extra / Qprev / y
        coef, *_ = np.linalg.lstsq(A * w[:, None], y * w, rcond=None)
        p = coef[:npn]; q = np.concatenate([[1.0], coef[npn:]])
        Q = sum(q[j] * u**j for j in range(nq + 1)); P = sum(p[i] * u**i for i in range(npn))
        r = x * P / Q
        err = np.abs(r - y) / y
        Qprev = Q
        # Lawson-like reweighting toward minimax
        w_extra = w_extra * (err / err.max()) ** 0.3 + 1e-3
    return p, q, err.max()
for npn, nq in [(5, 4), (5, 5), (6,5)]:
    p, q, e = fit(npn, nq)
    # float32 evaluation check
    xs = np.linspace(-10, 10, 2000001).astype(np.float32)
    xc = np.clip(xs, np.float32(-X), np.float32(X))
    uu = xc * xc
    P = np.float32(0); Q = np.float32(0)
    for c in p[::-1]: P = P * uu + np.float32(c)
    for c in q[::-1]: Q = Q * uu + np.float32(c)
    r = (xc * P / Q).astype(np.float32)
    ref = np.tanh(xs.astype(np.float64))
    print(npn, nq, "fit rel", e, "f32 max abs", np.abs(r - ref).max(), "max rel", (np.abs(r - ref) / np.maximum(np.abs(ref), 1e-30)).max())
    print("p", repr(p)); print("q", repr(q))
