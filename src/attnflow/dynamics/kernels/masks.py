"""Masks and positions: which logits a query row keeps, what is added to them, and how
queries and keys are turned by position.

``AbstractMask`` is an equinox module with
``keep(rows, cols)``  boolean, for query rows ``rows`` and key columns ``cols`` (token
                      indices): a dropped logit is ``-inf`` before the kernel (weight 0
                      under every kernel that takes a mask);
``bias(rows, cols)``  an additive bias of the kept logits (``None``: none), added after
                      ``beta``: ``L_ij = beta <q_i, k_j> + bias_ij`` (ALiBi);
``turn(q, k)``        queries ``(n, p)`` and keys ``(m, p)`` as the logits see them, by
                      position (RoPE; default unchanged);
``describe()``        the saved form, read back by ``check_mask``;
``positional``        a declared fact (class attribute): whether the mask moves the logits
                      by position (a bias or a turn: ALiBi, RoPE) rather than only
                      dropping them. A mask that overrides ``bias`` or ``turn`` declares
                      ``positional = True``; the kernels that take no positions and the
                      analyses read the fact, never the methods
                      (``attnflow.testing.check_mask`` holds the two together).

Masks are registered like kernels and families: a final mask class declares ``name``
(the first entry of its saved form ``describe()``) and is registered in ``MASK_CLASSES``
when its class is defined; ``check_mask`` rebuilds a saved form ``[name, *args]``
through the registered class's ``from_saved`` (default ``cls(*args)``), so a run with a
mask of one's own saves and loads once the module that defines the mask is imported
(as for a family of one's own). A name is registered once: a second class under the
name of another raises ``ValueError`` (a module imported again replaces its own).

Every mask here keeps the diagonal, so no row is empty, except ``Graph(adjacency)``, a
mask of any directed graph on a fixed number of tokens, which need not but must keep at
least one key in every row. Positions are token indices ``0 .. n-1``. ``check_mask``
accepts the objects, their saved forms and the older spellings (``"causal"``,
``("window", w)``). ``quasi_strongly_connected`` says whether a mask's graph has a token
that every token reaches (the condition of Wu et al.'s rank collapse), and
``random_qsc_graph`` draws such a graph.
"""

from __future__ import annotations

import abc
import math
from typing import Any, ClassVar

import equinox as eqx
import jax
import jax.core as jax_core
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float

__all__ = [
    "AbstractMask",
    "MASK_CLASSES",
    "Causal",
    "Window",
    "ALiBi",
    "RoPE",
    "SinkWindow",
    "Graph",
    "alibi_slopes",
    "quasi_strongly_connected",
    "random_qsc_graph",
    "check_mask",
    "mask_keep",
    "apply_mask",
]


# name -> final mask class, filled as the classes are defined (``name`` class attribute)
MASK_CLASSES: dict[str, type[AbstractMask]] = {}


class AbstractMask(eqx.Module):
    """What a mask subclasses: ``keep(rows, cols)`` and ``describe()``; a final mask sets
    the class attribute ``name`` (its saved name), which registers it for
    ``check_mask`` and ``Trajectory.load``, and, when its constructor does not take
    ``describe()[1:]`` as its arguments, overrides ``from_saved``."""

    name: ClassVar[str] = ""
    positional: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        name = cls.__dict__.get("name")
        if not isinstance(name, str) or not name:
            return
        old = MASK_CLASSES.get(name)
        same = old is not None and (old.__module__, old.__qualname__) == (
            cls.__module__,
            cls.__qualname__,
        )
        if old is not None and not same:
            raise ValueError(
                f"mask name {name!r} is taken by {old.__module__}.{old.__qualname__}: give "
                f"{cls.__qualname__} another class attribute name = '...'."
            )
        MASK_CLASSES[name] = cls

    @classmethod
    def from_saved(cls, form: list) -> AbstractMask:
        """The mask of its saved form ``describe()`` (after a JSON round trip: lists for
        tuples and arrays); default ``cls(*form[1:])``."""
        return cls(*form[1:])

    @abc.abstractmethod
    def keep(self, rows: Array, cols: Array) -> Bool[Array, "r m"]:
        """Which logits of query rows ``rows`` on key columns ``cols`` are kept."""

    @abc.abstractmethod
    def describe(self) -> list:
        """The saved form (JSON-ready), read back by ``check_mask``."""

    def bias(self, rows: Array, cols: Array) -> Float[Array, "r m"] | None:
        """The additive bias of the logits of rows ``rows`` on columns ``cols``; ``None``
        (the default) for none."""
        del rows, cols
        return None

    def turn(self, q: Array, k: Array) -> tuple[Array, Array]:
        """Queries ``(n, p)`` and keys ``(m, p)`` turned by position; default unchanged."""
        return q, k

    @property
    def heads(self) -> int | None:
        """The number of heads the mask has parameters for (``None``: one mask for
        every head)."""
        return None

    def head(self, h: int) -> AbstractMask:
        """The mask of head ``h`` (itself unless ``heads`` is set)."""
        del h
        return self

    def add_bias(self, L: Array, rows: Array, cols: Array) -> Array:
        """Logits ``L`` of query rows ``rows`` on columns ``cols`` with the bias added."""
        b = self.bias(rows, cols)
        return L if b is None else L + b.astype(L.dtype)

    def apply_rows(self, L: Array, rows: Array) -> Array:
        """Logits ``L`` ``(r, m)`` of query rows ``rows`` (indices) with the bias added and
        the dropped entries ``-inf``."""
        cols = jnp.arange(L.shape[-1])
        return jnp.where(self.keep(rows, cols), self.add_bias(L, rows, cols), -jnp.inf)

    def apply(self, L: Array, row0: Any = 0) -> Array:
        """Logits ``L`` ``(r, m)`` of query rows ``row0 ..`` with the bias added and the
        dropped entries ``-inf``."""
        return self.apply_rows(L, row0 + jnp.arange(L.shape[-2]))


class Causal(AbstractMask):
    """``P_ij = 0`` for ``j > i``: token ``i`` sees itself and the tokens before it."""

    name: ClassVar[str] = "causal"

    def keep(self, rows: Array, cols: Array) -> Array:
        return cols[None, :] <= rows[:, None]

    def describe(self) -> list:
        return ["causal"]


class Window(AbstractMask):
    """``P_ij = 0`` unless ``|i - j| <= w`` (a whole number ``w >= 0``)."""

    w: int = eqx.field(static=True)
    name: ClassVar[str] = "window"

    def __init__(self, w: int):
        if isinstance(w, (bool, np.bool_)) or not isinstance(w, (int, np.integer)) or w < 0:
            raise ValueError(
                f"mask=('window', w) needs a whole number w >= 0 (the largest |i - j| "
                f"attended); got w = {w!r}."
            )
        self.w = int(w)

    def keep(self, rows: Array, cols: Array) -> Array:
        return jnp.abs(rows[:, None] - cols[None, :]) <= self.w

    def describe(self) -> list:
        return ["window", self.w]


def alibi_slopes(heads: int) -> np.ndarray:
    """The slopes of Press et al.'s ALiBi for ``heads`` heads: ``2^(-8 h / heads)``,
    ``h = 1 .. heads`` (for a power of two; otherwise those of the next power of two
    below, then every other one of the next power above, as in their code)."""
    heads = int(heads)
    if heads < 1:
        raise ValueError(f"heads must be a whole number >= 1; got {heads}.")

    def power_of_two(n: int) -> list[float]:
        return [2.0 ** (-8.0 * (i + 1) / n) for i in range(n)]

    low = 2 ** int(math.floor(math.log2(heads)))
    out = power_of_two(low)
    if low < heads:
        out += power_of_two(2 * low)[0::2][: heads - low]
    return np.asarray(out)


def _slopes(value: Any) -> Array:
    if isinstance(value, jax_core.Tracer):
        return value
    arr = np.asarray(value, dtype=np.float64) if not isinstance(value, jax.Array) else value
    a = np.asarray(arr)
    if a.ndim > 1 or a.size == 0 or not np.all(np.isfinite(a)) or np.any(a < 0):
        raise ValueError(
            f"ALiBi(slopes) needs one slope >= 0, or one per head (a 1-d array); got "
            f"{value!r}. attnflow.masks.alibi_slopes(h) gives Press et al.'s."
        )
    return arr if isinstance(arr, jax.Array) else jnp.asarray(arr)


class ALiBi(AbstractMask):
    """Causal attention with a linear penalty of distance (Press et al., ALiBi):
    ``L_ij + slope * (j - i)`` for ``j <= i``, dropped for ``j > i``: under softmax the
    weights are those of the causal mask times ``e^{-slope (i - j)}`` (a kernel that
    scales the logits, ssmax or adaptive, scales the bias too; the linear kernels, whose
    weights are the logits, refuse it). ``slopes``: one slope, or one per head (a
    trainable leaf; ``alibi_slopes(h)`` gives the published ones). The lost-in-the-middle
    weights ``e^{-(lambda/N)(i - j)}`` are ``ALiBi(lambda / N)``."""

    slopes: Array
    name: ClassVar[str] = "alibi"
    positional: ClassVar[bool] = True

    def __init__(self, slopes: Any):
        self.slopes = _slopes(slopes)

    @property
    def heads(self) -> int | None:
        return None if jnp.ndim(self.slopes) == 0 else int(self.slopes.shape[0])

    def head(self, h: int) -> AbstractMask:
        return self if self.heads is None else ALiBi(self.slopes[h])

    def keep(self, rows: Array, cols: Array) -> Array:
        return cols[None, :] <= rows[:, None]

    def bias(self, rows: Array, cols: Array) -> Array:
        if self.heads is not None:
            raise ValueError(
                f"ALiBi has {self.heads} slopes, one per head: a one-head model takes "
                f"ALiBi(slope) with one slope (or ALiBi(slopes).head(h))."
            )
        dist = (cols[None, :] - rows[:, None]).astype(self.slopes.dtype)
        return self.slopes * jnp.minimum(dist, 0)

    def describe(self) -> list:
        return ["alibi", np.asarray(self.slopes).tolist()]


class RoPE(AbstractMask):
    """Rotary position embedding (Su et al.): the ``c``-th 2-plane (coordinates ``2c``
    and ``2c + 1``) of the query and key of token ``i`` is rotated by the angle
    ``i * base^(-2c / p)``, ``p`` the (even) query-key dimension, so the logit of ``i``
    on ``j`` depends on ``j - i`` only through the rotations. ``mask``: the mask applied
    beside it (``None``: every token sees every token; ``Causal()`` for a decoder)."""

    base: float = eqx.field(static=True)
    mask: AbstractMask | None
    name: ClassVar[str] = "rope"
    positional: ClassVar[bool] = True

    def __init__(self, base: float = 10000.0, mask: Any = None):
        try:
            b = float(base)
        except (TypeError, ValueError):
            b = float("nan")
        if not math.isfinite(b) or b <= 1:
            raise ValueError(f"RoPE(base) needs a finite number > 1; got base = {base!r}.")
        self.base = b
        self.mask = check_mask(mask)
        if isinstance(self.mask, RoPE):
            raise ValueError("RoPE(mask=RoPE(...)): rotate once; give RoPE a plain mask.")

    @property
    def heads(self) -> int | None:
        return None if self.mask is None else self.mask.heads

    def head(self, h: int) -> AbstractMask:
        return self if self.heads is None else RoPE(self.base, self.mask.head(h))  # pyright: ignore[reportOptionalMemberAccess]

    def keep(self, rows: Array, cols: Array) -> Array:
        if self.mask is None:
            return jnp.ones((rows.shape[0], cols.shape[0]), dtype=bool)
        return self.mask.keep(rows, cols)

    def bias(self, rows: Array, cols: Array) -> Array | None:
        return None if self.mask is None else self.mask.bias(rows, cols)

    def turn(self, q: Array, k: Array) -> tuple[Array, Array]:
        p = q.shape[-1]
        if p % 2:
            raise ValueError(
                f"RoPE rotates 2-planes of the queries and keys: their dimension must be "
                f"even; got {p}."
            )
        freq = self.base ** (-np.arange(0, p, 2) / p)

        def rotate(u):
            ang = jnp.arange(u.shape[0], dtype=u.dtype)[:, None] * jnp.asarray(freq, u.dtype)[None]
            c, s = jnp.cos(ang), jnp.sin(ang)
            a, b = u[..., 0::2], u[..., 1::2]
            return jnp.stack([a * c - b * s, a * s + b * c], axis=-1).reshape(u.shape)

        q, k = rotate(q), rotate(k)
        return (q, k) if self.mask is None else self.mask.turn(q, k)

    def describe(self) -> list:
        return ["rope", self.base, None if self.mask is None else self.mask.describe()]


class SinkWindow(AbstractMask):
    """StreamingLLM's mask (Xiao et al.): causal, and token ``i`` sees the first
    ``sinks`` tokens and the ``w`` tokens before it: ``j <= i`` and (``j < sinks`` or
    ``i - j <= w``)."""

    sinks: int = eqx.field(static=True)
    w: int = eqx.field(static=True)
    name: ClassVar[str] = "sinkwindow"

    def __init__(self, sinks: int, w: int):
        for arg, v in (("sinks", sinks), ("w", w)):
            if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)) or v < 0:
                raise ValueError(f"SinkWindow({arg}) needs a whole number >= 0; got {v!r}.")
        self.sinks, self.w = int(sinks), int(w)

    def keep(self, rows: Array, cols: Array) -> Array:
        i, j = rows[:, None], cols[None, :]
        return (j <= i) & ((j < self.sinks) | (i - j <= self.w))

    def describe(self) -> list:
        return ["sinkwindow", self.sinks, self.w]


def _adjacency(value: Any) -> Array:
    """``Graph``'s adjacency checked: a square boolean (or 0/1) matrix whose every row
    keeps a key; a traced array is taken as it is (checked when it was built)."""
    if isinstance(value, jax_core.Tracer):
        return value
    try:
        a = np.asarray(value)
    except (TypeError, ValueError):
        a = np.asarray(None)
    if a.ndim != 2 or a.shape[0] != a.shape[1] or a.shape[0] < 1:
        raise ValueError(
            f"Graph(adjacency) needs a square boolean (n, n) matrix, n >= 1 (row i: the "
            f"keys token i may attend to); got shape {a.shape} ({value!r:.80})."
        )
    if a.dtype != np.bool_:
        ok = a.dtype.kind in "iuf" and bool(np.all((a == 0) | (a == 1)))
        if not ok:
            raise ValueError(
                f"Graph(adjacency) needs booleans (or the numbers 0 and 1); got dtype "
                f"{a.dtype} with entries other than 0 and 1."
            )
        a = a.astype(bool)
    empty = np.flatnonzero(~a.any(axis=1))
    if empty.size:
        i = int(empty[0])
        raise ValueError(
            f"Graph(adjacency): row {i} keeps no key (token {i} attends to nothing, so "
            f"its softmax has no weights); every row must keep at least one key, e.g. "
            f"adjacency[{i}, {i}] = True ({empty.size} empty row(s): {empty[:8].tolist()})."
        )
    return jnp.asarray(a)


class Graph(AbstractMask):
    """The mask of a directed graph on ``n`` tokens: ``adjacency[i, j]`` True when token
    ``i`` may attend to token ``j`` (row ``i``: the keys query ``i`` keeps). Every row
    must keep at least one key; the diagonal need not be kept. The mask is for exactly
    ``n`` tokens: a model with it refuses any other number (``ValueError`` naming the
    mask). ``quasi_strongly_connected(adjacency)`` says whether a token is reachable
    from every token along ``i -> j`` (``i`` attends to ``j``), Wu et al.'s condition
    for the rank collapse of pure masked attention.

    Args:
        adjacency: boolean ``(n, n)`` (or the numbers 0 and 1), kept as a boolean array.

    Examples:
        >>> import numpy as np
        >>> from attnflow.masks import Graph
        >>> A = np.array([[1, 1, 0], [0, 1, 1], [1, 0, 1]], bool)  # a directed 3-cycle
        >>> m = Graph(A)
        >>> m.describe()
        ['graph', [[1, 1, 0], [0, 1, 1], [1, 0, 1]]]
        >>> m.apply(np.zeros((3, 3))).tolist()[0]
        [0.0, 0.0, -inf]
    """

    adjacency: Bool[Array, "n n"]
    name: ClassVar[str] = "graph"

    def __init__(self, adjacency: Any):
        self.adjacency = _adjacency(adjacency)

    @property
    def n(self) -> int:
        """The number of tokens the mask is for."""
        return int(self.adjacency.shape[0])

    def keep(self, rows: Array, cols: Array) -> Array:
        n = self.n
        if cols.shape[0] != n:
            raise ValueError(
                f"mask Graph is for n = {n} tokens (its adjacency is {n} x {n}); the "
                f"attention has {cols.shape[0]} keys: build the Graph for that many tokens."
            )
        # rows past n - 1 are the padding of the last query tile (discarded): any row
        r = jnp.clip(rows, 0, n - 1)
        c = jnp.clip(cols, 0, n - 1)
        return self.adjacency[r[:, None], c[None, :]]

    def describe(self) -> list:
        return ["graph", np.asarray(self.adjacency).astype(int).tolist()]


def _reach_graph(adjacency: Any) -> np.ndarray:
    a = adjacency.adjacency if isinstance(adjacency, Graph) else adjacency
    a = np.asarray(a)
    if a.ndim != 2 or a.shape[0] != a.shape[1] or a.shape[0] < 1:
        raise ValueError(
            f"adjacency must be a square (n, n) matrix (or a Graph), n >= 1; got shape {a.shape}."
        )
    return a.astype(bool)


def quasi_strongly_connected(adjacency: Bool[Any, "n n"] | Graph) -> bool:
    """Whether some token (a root) is reachable from every token in the graph with an
    edge ``i -> j`` when ``adjacency[i, j]`` (token ``i`` attends to token ``j``).

    Equivalently the graph of the information flow (``j -> i`` when ``i`` attends to
    ``j``) has a node from which every node is reachable: the quasi-strong connectivity
    under which Wu, Ajorlou, Wang, Jegelka and Jadbabaie (2024, "On the role of attention
    masks and LayerNorm in transformers") prove that pure masked attention collapses to
    rank one exponentially. Decided by the strongly connected components
    (``scipy.sparse.csgraph``): it holds exactly when one component has no edge out.

    Args:
        adjacency: boolean ``(n, n)`` (row ``i``: the keys of token ``i``) or a ``Graph``.

    Returns:
        ``True`` when a root exists.

    Examples:
        >>> import numpy as np
        >>> from attnflow.masks import quasi_strongly_connected
        >>> quasi_strongly_connected(np.tril(np.ones((4, 4), bool)))  # causal: token 0
        True
        >>> quasi_strongly_connected(np.eye(3, dtype=bool))  # each token alone
        False
    """
    from scipy.sparse import csr_matrix
    from scipy.sparse.csgraph import connected_components

    a = _reach_graph(adjacency)
    count, label = connected_components(csr_matrix(a), directed=True, connection="strong")
    i, j = np.nonzero(a)
    leaves = label[i][label[i] != label[j]]  # components with an edge out
    return bool(count - np.unique(leaves).size == 1)


def random_qsc_graph(n: int, p: float, seed: int) -> Bool[np.ndarray, "n n"]:
    """A random quasi-strongly connected graph on ``n`` tokens: the diagonal, a random
    tree along which every token reaches a random root (each token after the first of a
    random order attends to one token before it), and every other edge with probability
    ``p``.

    Args:
        n: tokens (``>= 1``).
        p: the probability of each further edge, in ``[0, 1]``.
        seed: the seed of ``numpy.random.default_rng``.

    Returns:
        boolean ``(n, n)``, row ``i`` the keys of token ``i``; ``Graph(...)`` of it is a
        mask.

    Examples:
        >>> from attnflow.masks import quasi_strongly_connected, random_qsc_graph
        >>> A = random_qsc_graph(6, 0.1, seed=0)
        >>> A.shape, bool(A.diagonal().all()), quasi_strongly_connected(A)
        ((6, 6), True, True)
    """
    if isinstance(n, (bool, np.bool_)) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"n must be a whole number >= 1; got n = {n!r}.")
    try:
        q = float(p)
    except (TypeError, ValueError):
        q = float("nan")
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"p must be a probability in [0, 1]; got p = {p!r}.")
    rng = np.random.default_rng(seed)
    order = rng.permutation(int(n))
    a = rng.uniform(size=(n, n)) < q
    a[np.arange(n), np.arange(n)] = True
    for k in range(1, n):
        a[order[k], order[rng.integers(k)]] = True  # towards order[0], the root
    return a


def check_mask(mask: Any) -> AbstractMask | None:
    """The mask argument of an attention model, checked and normalised to an object.

    ``None`` (every token sees every token), ``"causal"`` or ``Causal()``,
    ``("window", w)`` or ``Window(w)`` (an integer ``w >= 0``), the saved forms
    ``["alibi", slopes]``, ``["rope", base, mask]``, ``["sinkwindow", sinks, w]``,
    ``["graph", adjacency]``, the saved form ``[name, ...]`` of any registered mask
    (``MASK_CLASSES``: a mask of one's own once its module is imported), or any
    ``AbstractMask``. ``ValueError`` naming ``mask`` otherwise."""
    if mask is None or isinstance(mask, AbstractMask):
        return mask
    form = None
    if isinstance(mask, str):
        form = [mask]
    elif isinstance(mask, (tuple, list)) and len(mask) >= 1 and isinstance(mask[0], str):
        form = list(mask)
    if form is not None and form[0] in MASK_CLASSES:
        cls = MASK_CLASSES[form[0]]
        try:
            out = cls.from_saved(form)
        except TypeError as exc:
            raise ValueError(
                f"mask {mask!r:.120}: the saved form of {cls.__qualname__} does not rebuild "
                f"it ({exc}); pass the mask object itself or its describe()."
            ) from None
        if not isinstance(out, AbstractMask):
            raise ValueError(
                f"mask {mask!r:.120}: {cls.__qualname__}.from_saved returned "
                f"{type(out).__name__}, not a mask."
            )
        return out
    raise ValueError(
        f"mask must be None, 'causal' or ('window', w) with an integer w >= 0, an "
        f"attnflow.masks object (Causal, Window, ALiBi, RoPE, SinkWindow, Graph) or the "
        f"saved form [name, ...] of a registered mask (known: {sorted(MASK_CLASSES)}; a "
        f"mask of one's own is registered by its class attribute name = '...' once its "
        f"module is imported: import it before Trajectory.load); got {mask!r:.200}."
    )


def mask_keep(mask: Any, rows: Array, cols: Array) -> Array | None:
    """Boolean ``(len(rows), len(cols))``: which logits the mask keeps; ``None`` when it
    keeps all."""
    m = check_mask(mask)
    return None if m is None else m.keep(rows, cols)


def apply_mask(L: Array, mask: Any, row0: Any = 0) -> Array:
    """Logits ``L`` ``(r, m)`` of query rows ``row0 .. row0 + r - 1`` with the entries the
    mask drops set to ``-inf``. ``mask=None`` returns ``L`` itself, untouched."""
    m = check_mask(mask)
    return L if m is None else m.apply(L, row0)
