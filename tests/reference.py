"""A plain numpy implementation of the particle system, independent of attnflow.

Used as the reference in the tests: fixed-step classical RK4 in both frames, forward Euler
for the discrete transformer, and a Taylor-series matrix exponential with scaling and
squaring (no eigendecomposition, so it shares no code path with attnflow's propagator).
"""

import numpy as np


def softmax_rows(L):
    L = L - L.max(axis=1, keepdims=True)
    E = np.exp(L)
    return E / E.sum(axis=1, keepdims=True)


def expm(A, terms=30):
    """e^A by scaling and squaring of a truncated Taylor series."""
    A = np.asarray(A, dtype=np.float64)
    norm = np.abs(A).sum(axis=1).max()
    s = max(0, int(np.ceil(np.log2(norm + 1e-300))) + 1) if norm > 0.5 else 0
    B = A / 2.0**s
    term = np.eye(A.shape[0])
    out = term.copy()
    for k in range(1, terms):
        term = term @ B / k
        out = out + term
    for _ in range(s):
        out = out @ out
    return out


def attention(x, Q, K, beta=1.0):
    """P_ij = softmax_j(beta <Q x_i, K x_j>) for tokens as rows of x."""
    q = np.einsum("ab,nb->na", Q, x)
    k = np.einsum("ab,nb->na", K, x)
    return softmax_rows(beta * q @ k.T)


def field_original(t, x, Q, K, V, beta=1.0):
    P = attention(x, Q, K, beta)
    # dx_i = sum_j P_ij V x_j, token by token
    out = np.zeros_like(x)
    for i in range(x.shape[0]):
        for j in range(x.shape[0]):
            out[i] += P[i, j] * (V @ x[j])
    return out


def field_rescaled(t, z, Q, K, V, beta=1.0):
    E = expm(t * V)
    x = z @ E.T
    P = attention(x, Q, K, beta)
    out = np.zeros_like(z)
    for i in range(z.shape[0]):
        for j in range(z.shape[0]):
            out[i] += P[i, j] * (V @ (z[j] - z[i]))
    return out


def rk4(field, y0, ts, h, *args):
    """Classical RK4 with steps of at most h, landing exactly on every saved time."""
    y = np.array(y0, dtype=np.float64)
    t = 0.0
    out = []
    for target in ts:
        while t < target - 1e-15:
            step = min(h, target - t)
            k1 = field(t, y, *args)
            k2 = field(t + step / 2, y + step / 2 * k1, *args)
            k3 = field(t + step / 2, y + step / 2 * k2, *args)
            k4 = field(t + step, y + step * k3, *args)
            y = y + step / 6 * (k1 + 2 * k2 + 2 * k3 + k4)
            t += step
        out.append(y.copy())
    return np.array(out)


def euler_original(x0, Q, K, V, dt, layers, beta=1.0):
    """x^{k+1} = x^k + dt sum_j P_ij V x_j^k; returns all layers (layers + 1, n, d)."""
    xs = [np.array(x0, dtype=np.float64)]
    for _ in range(layers):
        x = xs[-1]
        xs.append(x + dt * field_original(0.0, x, Q, K, V, beta))
    return np.array(xs)


# ---------------------------------------------------- kernels beyond softmax ([K])
# Loops and explicit products, deliberately unlike attnflow's vectorised log-space code.
def elu1(u):
    u = np.asarray(u, np.float64)
    return np.where(u > 0, u + 1.0, np.exp(np.minimum(u, 0.0)))


def _sig(u):
    return 1.0 / (1.0 + np.exp(-u))


def kernel_weights(name, x, Q, K, beta=1.0, lam=0.2, mask=None):
    """Attention matrix of tokens ``x`` (rows) under the kernels of REFERENCES.md [K].

    ``mask``: None or "causal" (j <= i kept)."""
    x = np.asarray(x, np.float64)
    n = x.shape[0]
    if name == "prenorm":
        x = x / np.sqrt(np.mean(x * x, axis=1, keepdims=True))
    q, k = x @ np.asarray(Q).T, x @ np.asarray(K).T
    keep = np.ones((n, n), bool) if mask is None else np.tril(np.ones((n, n), bool))
    P = np.zeros((n, n))
    for i in range(n):
        js = [j for j in range(n) if keep[i, j]]
        if name in ("linear", "linearnorm"):
            row = np.array([beta * elu1(q[i]) @ elu1(k[j]) for j in js])
            if name == "linearnorm":
                row = row / row.sum()
        elif name == "stickbreaking":
            s = _sig(np.array([beta * q[i] @ k[j] for j in js]))
            row = np.array([s[a] * np.prod(1.0 - s[a + 1 :]) for a in range(len(js))])
        elif name == "offbyone":
            e = np.exp(np.array([beta * q[i] @ k[j] for j in js]))
            row = e / (1.0 + e.sum())
        elif name == "prenorm":
            row = softmax_rows(np.array([[beta * q[i] @ k[j] for j in js]]))[0]
        elif name == "differential":
            h = q.shape[1] // 2
            l1 = np.array([[beta * q[i, :h] @ k[j, :h] for j in js]])
            l2 = np.array([[beta * q[i, h:] @ k[j, h:] for j in js]])
            row = softmax_rows(l1)[0] - lam * softmax_rows(l2)[0]
        elif name == "selective":
            L = beta * q @ k.T
            # S_kj = relu(L_kj) for 0 < j < k; F_ij = sum_{k < i} S_kj
            F = np.zeros(n)
            for kk in range(i):
                for j in range(1, kk):
                    F[j] += max(L[kk, j], 0.0)
            js = [j for j in range(i + 1)]
            row = softmax_rows(np.array([[L[i, j] - F[j] for j in js]]))[0]
        else:
            raise ValueError(name)
        P[i, js] = row
    return P


def euler_kernel(name, x0, Q, K, V, dt, layers, beta=1.0, **kw):
    """Forward Euler in the original frame under ``kernel_weights``."""
    x = np.array(x0, np.float64)
    for _ in range(layers):
        x = x + dt * kernel_weights(name, x, Q, K, beta, **kw) @ x @ np.asarray(V).T
    return x
