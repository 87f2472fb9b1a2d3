"""A plain numpy implementation of the particle system, independent of attnflow.

Contract: nothing here imports attnflow or JAX; every function takes and returns numpy
arrays (float64). ``attnflow.testing`` holds models against it, and the project's tests
import it (``tests/reference.py`` re-exports it). Fixed-step classical RK4 in both
frames, forward Euler for the discrete transformer, and a Taylor-series matrix
exponential with scaling and squaring (no eigendecomposition, so it shares no code path
with attnflow's propagator). ``kernel_weights`` writes out every attention kernel of
``attnflow.kernels`` under every mask of ``attnflow.masks`` (causal, window, ALiBi, RoPE,
sink-plus-window, graph), row by row with loops (``kernel_rows`` from prepared queries
and keys, the kept keys and a bias); thresholds (sparsemax, entmax) by plain bisection
rather than a sort. ``dispersion_rows`` and ``log_mass_rows``: the numbers the analyses
derive, row by row.
"""

# pyright: reportOperatorIssue=false

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


def _rms(u):
    """Each row divided by its root mean square (a zero row stays zero)."""
    r = np.sqrt(np.mean(u * u, axis=1, keepdims=True))
    return np.where(r > 0, u / np.where(r > 0, r, 1.0), 0.0)


# ---------------------------------------------------------------------------- masks
# A mask is None, "causal", or a tuple: ("window", w), ("alibi", slope),
# ("rope", base, inner) with ``inner`` one of these (not a rope), ("sinkwindow", sinks, w),
# ("graph", adjacency).
def mask_keep(mask, n):
    """Boolean (n, n): which logits of query i on key j the mask keeps."""
    keep = np.ones((n, n), bool)
    if isinstance(mask, tuple) and mask[0] == "graph":
        return np.array(mask[1], dtype=bool).copy()
    for i in range(n):
        for j in range(n):
            if mask is None:
                continue
            kind = mask if isinstance(mask, str) else mask[0]
            if kind in ("causal", "alibi"):
                keep[i, j] = j <= i
            elif kind == "window":
                keep[i, j] = abs(i - j) <= mask[1]
            elif kind == "sinkwindow":
                keep[i, j] = j <= i and (j < mask[1] or i - j <= mask[2])
            elif kind == "rope":
                keep[i, j] = mask_keep(mask[2], n)[i, j]
            else:
                raise ValueError(mask)
    return keep


def mask_bias(mask, n):
    """(n, n) additive bias of the kept logits: ALiBi's -slope (i - j), else 0."""
    out = np.zeros((n, n))
    if isinstance(mask, tuple) and mask[0] == "rope":
        return mask_bias(mask[2], n)
    if isinstance(mask, tuple) and mask[0] == "alibi":
        for i in range(n):
            for j in range(i + 1):
                out[i, j] = -mask[1] * (i - j)
    return out


def rope_rotate(u, base):
    """Rotate the c-th 2-plane (coordinates 2c, 2c + 1) of row i by i base^(-2c / p)."""
    n, p = u.shape
    if p % 2:
        raise ValueError("RoPE needs an even dimension")
    out = np.empty_like(u)
    for i in range(n):
        for c in range(p // 2):
            a = i * base ** (-2.0 * c / p)
            out[i, 2 * c] = np.cos(a) * u[i, 2 * c] - np.sin(a) * u[i, 2 * c + 1]
            out[i, 2 * c + 1] = np.sin(a) * u[i, 2 * c] + np.cos(a) * u[i, 2 * c + 1]
    return out


# -------------------------------------------------------------------- kernel rows
def _softmax(row):
    e = np.exp(row - row.max())
    return e / e.sum()


def _threshold(total, lo, hi):
    """tau in [lo, hi] with total(tau) = 1 (total decreasing), by plain bisection."""
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if mid in (lo, hi):
            break
        lo, hi = (mid, hi) if total(mid) >= 1.0 else (lo, mid)
    return 0.5 * (lo + hi)


def _sparsemax(row):
    tau = _threshold(lambda t: np.sum(np.maximum(row - t, 0.0)), row.max() - 1.0, row.max())
    support = row > tau  # the exact threshold of this support
    tau = (row[support].sum() - 1.0) / support.sum()
    return np.maximum(row - tau, 0.0)


def _entmax(row, alpha):
    z = (alpha - 1.0) * row

    def weights(t):
        return np.maximum(z - t, 0.0) ** (1.0 / (alpha - 1.0))

    w = weights(_threshold(lambda t: weights(t).sum(), z.max() - 1.0, z.max()))
    return w / w.sum()


ADAPTIVE_POLY = (-0.037, 0.481, -2.3, 4.917, -1.791)  # Velickovic et al. (2024)


def _row(name, row, n, p):
    """The weights of the kept logits ``row`` of one query (``n`` keys in all)."""
    if name in ("softmax", "qknorm", "prenorm"):
        return _softmax(row)
    if name == "ssmax":
        return _softmax(p.get("s", 1.0) * np.log(n) * row)
    if name == "sigmoid":
        return _sig(row - np.log(n))
    if name == "adaptive":
        s = _softmax(row)
        H = -np.sum(s * np.log(s + 1e-9))
        inv = max(np.polyval(ADAPTIVE_POLY, H), 1.0) if H > 0.5 else 1.0
        return _softmax(inv * row)
    if name == "usa":
        return np.exp(row) / n
    if name == "linear":
        return row
    if name == "linearnorm":
        return row / row.sum()
    if name == "stickbreaking":
        s = _sig(row)
        return np.array([s[a] * np.prod(1.0 - s[a + 1 :]) for a in range(len(row))])
    if name == "offbyone":
        e = np.exp(row)
        return e / (1.0 + e.sum())
    if name in ("sink", "qknorm_sink"):
        e = np.exp(row)
        return e / (np.exp(p.get("b", 0.0)) + e.sum())
    if name == "softpick":
        e = np.expm1(row)
        den = np.abs(e).sum()
        return np.maximum(e, 0.0) / den if den > 0 else np.zeros_like(row)
    if name == "hardmax":
        win = (row == row.max()).astype(float)
        return win / win.sum()
    if name == "sparsemax":
        return _sparsemax(row)
    if name == "entmax":
        return _entmax(row, p.get("alpha", 1.5))
    raise ValueError(name)


def _logsumexp(L, axis):
    m = np.max(L, axis=axis, keepdims=True)
    return m + np.log(np.sum(np.exp(L - m), axis=axis, keepdims=True))


def kernel_weights(name, x, Q, K, beta=1.0, lam=0.2, mask=None, **params):
    """Attention matrix of tokens ``x`` (rows) under every kernel of attnflow.kernels.

    ``mask``: None, "causal" or a tuple (see ``mask_keep``): a dropped key weighs 0 and
    is left out of the row; ALiBi's bias is added to the kept logits
    ``beta <q_i, k_j>``; RoPE turns the queries and keys (after the kernel's own
    preparation: qknorm's RMS norm and gains, linear's elu + 1). ``params``: the kernel's
    parameters (``s``, ``b``, ``wq``, ``wk``, ``alpha``, ``iters``; ``lam`` for
    differential), defaults where missing. A kernel that reads ``n`` (ssmax, sigmoid,
    usa) counts every key, the masked ones too."""
    x = np.asarray(x, np.float64)
    n = x.shape[0]
    if name == "prenorm":
        x = _rms(x)
    q, k = x @ np.asarray(Q, np.float64).T, x @ np.asarray(K, np.float64).T
    q, k = kernel_prepare(name, q, k, **params)
    if isinstance(mask, tuple) and mask[0] == "rope":
        q, k = rope_rotate(q, mask[1]), rope_rotate(k, mask[1])
    keep, bias = mask_keep(mask, n), mask_bias(mask, n)
    return kernel_rows(name, q, k, beta, keep, bias, lam=lam, masked=mask is not None, **params)


def kernel_prepare(name, q, k, **params):
    """Queries and keys as kernel ``name`` sees them: qknorm's RMS norm and gains,
    linear's elu + 1; unchanged otherwise."""
    if name in ("qknorm", "qknorm_sink"):
        q, k = _rms(q), _rms(k)
        if params.get("wq") is not None:
            q = q * np.asarray(params["wq"], np.float64)[None, :]
        if params.get("wk") is not None:
            k = k * np.asarray(params["wk"], np.float64)[None, :]
    if name in ("linear", "linearnorm"):
        q, k = elu1(q), elu1(k)
    return q, k


def sinkhorn_rows(L, iters=None, tol=None, max_iters=None):
    """Sinkhorn's iterations of the logits ``L`` (``-inf`` masked), columns then rows in
    the log domain: exactly ``iters`` of them when given, else until every column sum
    holding weight is within ``tol`` (default 1e-12, float64's) of ``n / m``, at most
    ``max_iters`` (default 1000). Returns the weights."""
    L = np.array(L, np.float64)
    n, m = L.shape
    tol = 1e-12 if tol is None else tol
    cap = 1000 if max_iters is None else max_iters
    done = 0
    while True:
        c = _logsumexp(L, 0)
        L = L - np.where(np.isfinite(c), c, 0.0)
        r = _logsumexp(L, 1)
        L = L - np.where(np.isfinite(r), r, 0.0)
        done += 1
        if iters is not None:
            if done >= iters:
                break
            continue
        cols = np.exp(L).sum(axis=0)
        held = cols > 0
        if done >= cap or np.max(np.abs(cols[held] - n / m), initial=0.0) <= tol:
            break
    return np.exp(L)


def kernel_rows(name, q, k, beta, keep, bias, lam=0.2, masked=True, **params):
    """The attention matrix of kernel ``name`` from prepared (and turned) queries ``q``
    and keys ``k``, the kept keys ``keep`` (boolean (n, n)) and the bias of the kept
    logits ``bias`` ((n, n)), row by row with loops."""
    n = q.shape[0]
    if name == "differential":
        if masked:
            raise ValueError("differential takes no mask")
        h = q.shape[1] // 2
        P = np.zeros((n, n))
        for i in range(n):
            l1 = np.array([beta * q[i, :h] @ k[j, :h] for j in range(n)])
            l2 = np.array([beta * q[i, h:] @ k[j, h:] for j in range(n)])
            P[i] = _softmax(l1) - lam * _softmax(l2)
        return P
    # the kept logits, -inf elsewhere
    L = np.full((n, n), -np.inf)
    for i in range(n):
        for j in range(n):
            if keep[i, j]:
                L[i, j] = beta * (q[i] @ k[j]) + bias[i, j]
    P = np.zeros((n, n))
    if name == "sinkhorn":  # columns, then rows, in the log domain
        return sinkhorn_rows(L, params.get("iters"), params.get("tol"), params.get("max_iters"))
    if name == "selective":  # causal always: F_ij = sum_{k < i} relu(L_kj), 0 < j < k
        for i in range(n):
            F = np.zeros(n)
            for kk in range(i):
                for j in range(1, kk):
                    if np.isfinite(L[kk, j]):
                        F[j] += max(L[kk, j], 0.0)
            js = [j for j in range(i + 1) if keep[i, j]]
            P[i, js] = _softmax(np.array([L[i, j] - F[j] for j in js]))
        return P
    for i in range(n):
        js = [j for j in range(n) if keep[i, j]]
        P[i, js] = _row(name, L[i, js], n, params)
    return P


def euler_kernel(name, x0, Q, K, V, dt, layers, beta=1.0, **kw):
    """Forward Euler in the original frame under ``kernel_weights``."""
    x = np.array(x0, np.float64)
    for _ in range(layers):
        x = x + dt * kernel_weights(name, x, Q, K, beta, **kw) @ x @ np.asarray(V).T
    return x


# ---------------------------------------------------------------- derived numbers
def dispersion_rows(P, L, keep, keep_logits=None):
    """Per row, over the keys ``keep`` (boolean (r, n)) it keeps, written out row by row:
    ``max``, ``kept`` (n_i), ``delta`` (spread of the kept logits: those of
    ``keep_logits``, default ``keep``, for logits of another width), ``bound_tight``
    ``1 / (1 + (n_i - 1) e^{-delta})``, ``entropy`` (nats, of the row normalised to one)
    and ``entropy_normalized`` (``entropy / log n_i``, 0 for one key)."""
    P, L, keep = (np.asarray(a) for a in (P, L, keep))
    kl = keep if keep_logits is None else np.asarray(keep_logits)
    out = {k: [] for k in ("max", "kept", "delta", "bound_tight", "entropy", "entropy_normalized")}
    for i in range(P.shape[0]):
        ni = int(sum(1 for j in range(P.shape[1]) if keep[i, j]))
        row = P[i] / P[i].sum()
        ent = -sum(a * np.log(a) for a in row if a > 0)
        vals = [float(L[i, j]) for j in range(L.shape[1]) if kl[i, j]]
        delta = max(vals) - min(vals)
        out["max"].append(P[i].max())
        out["kept"].append(ni)
        out["delta"].append(delta)
        out["bound_tight"].append(1.0 / (1.0 + (ni - 1) * np.exp(-delta)))
        out["entropy"].append(ent)
        out["entropy_normalized"].append(ent / np.log(ni) if ni > 1 else 0.0)
    return {k: np.asarray(v, np.float64) for k, v in out.items()}


def log_mass_rows(P, keep):
    """``log sum_{j in keep} P_ij`` per row (``-inf`` for an empty sum)."""
    P, keep = np.asarray(P, np.float64), np.asarray(keep, bool)
    with np.errstate(divide="ignore", invalid="ignore"):  # NaN for a negative mass
        return np.log(np.array([P[i, keep[i]].sum() for i in range(P.shape[0])]))
