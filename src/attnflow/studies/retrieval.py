"""Max retrieval: one trained attention head read at sizes it never saw (Velickovic et al.).

The task of "softmax is not enough" (arXiv 2410.01104): a set of ``n`` items, item ``j``
the 11-vector ``[p_j, onehot(c_j)]`` with priority ``p_j ~ U(0, 1)`` and class
``c_j ~ U{0..9}``; the target is the class of the item of largest priority. A query token
made from a random scalar (no task information) attends over the items with one head:

    e_j = MLP_item(item_j),  u = MLP_query(s),  q = W_q u,  k_j = W_k e_j,  v_j = W_v e_j,
    P = kernel(beta <q, k_j>)  (attnflow's registry: the same code as ``simulate``),
    logits = MLP_out(sum_j P_j v_j)  (10 classes).

Trained at ``n = 16`` with optax Adam and cross-entropy until the in-distribution
accuracy stops improving (early stopping with a patience), then evaluated at
``n = 16 ... 16384`` with no parameter changed; ``kernel="adaptive"`` at evaluation reads
the softmax-trained model with the adaptive temperature, as the paper does.

Choices where the paper is silent: every MLP
has ``depth`` hidden layers of ``width`` units with GELU (default 2 and 128); the head
size is ``width``; ``beta = 1/sqrt(head size)``; ``prenorm`` and ``qknorm`` normalise the
item and query embeddings (resp. queries and keys) as the kernels define; the set size in
training is fixed at 16; batch 128, Adam at ``lr = 1e-3``; early stopping on a fixed
validation set of 2048 sets at ``n = 16``, evaluated every ``eval_every`` steps, with a
patience of ``patience`` evaluations. For ``selective`` (a causal kernel) the items come
first and the query token last, and every item is also a query (its selection scores feed
the query's row); for ``stickbreaking`` the order is the item order, the query after all
items. ``differential`` splits the head into two halves of ``width / 2`` with a fixed
``lam = 0.2`` (Ye et al.'s ``lambda_init`` of the first layer; no learned lambda, no
GroupNorm).

Arithmetic is float32 whatever JAX's x64 mode (the model's arrays and the data are
created float32).

Saved models: ``cache/<kernel>-<hash>/`` holds ``config.json``, ``model.eqx``
(``eqx.tree_serialise_leaves`` of the best model, written atomically), ``train.json``
(history, timings and the SHA-256 of ``model.eqx``, written last: it marks the model
finished) and, while training, ``checkpoint.bin`` (model, optimizer state, best model
and step record in one file, written atomically, the previous one kept as
``checkpoint.bin.prev``; ``attnflow.networks._checkpoint``) every ``checkpoint_every``
steps, from which an interrupted run resumes, bit for bit, whenever it was killed.
``load_or_train`` reuses a finished model only through checks: its ``config.json`` must
be this configuration, its ``train.json`` a record of the right fields, its ``model.eqx``
match the recorded hash (caches written before the hash was recorded have none) and
every array header the model's shape and dtype, checked before the array is read; a
damaged or malformed file is one ``ValueError`` naming it (delete the folder or pass
``retrain=True``).

The task's data and the network (``RetrievalConfig``, ``sample_sets``,
``RetrievalModel``, ``head_weights``) are defined in
``attnflow.networks._retrieval_model`` and importable from here; this module, the study,
trains (through ``attnflow.networks._training``), evaluates and decides.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._stats import binomial_interval
from ..analysis.dispersion import bound_tight, dispersion
from ..networks import _training
from ..networks._retrieval_model import (
    EVAL_ONLY,
    RetrievalConfig,
    RetrievalModel,
    head_from_embeddings,
    head_weights,
    load_finished,
    sample_sets,
)

__all__ = [
    "RetrievalConfig",
    "RetrievalModel",
    "sample_sets",
    "head_weights",
    "train",
    "load_or_train",
    "evaluate",
    "evaluate_many",
    "SIZES",
    "PAPER_ACCURACY",
    "PAPER_ACCURACY_ADAPTIVE",
]

SIZES = tuple(16 * 2**k for k in range(11))  # 16, 32, ..., 16384
# The paper's accuracy (%) of its softmax head, and with adaptive temperature
PAPER_ACCURACY = {16: 98.6, 64: 94.3, 256: 81.3, 1024: 53.8, 4096: 22.6, 16384: 12.4}
PAPER_ACCURACY_ADAPTIVE = {16: 98.6, 64: 94.5, 256: 82.1, 1024: 57.7, 4096: 24.9, 16384: 14.0}
# selective forms the (n+1) x (n+1) matrix of the items: evaluated up to this size only
SELECTIVE_MAX_N = 1024


# ------------------------------------------------------------ loss and accuracy
def _class_logits(model: RetrievalModel, items, query, kernel: str):
    _, _, out = head_weights(model, items, query, kernel)
    return model.out_mlp(out)


def _loss(model, items, query, target):
    logits = jax.vmap(lambda a, b: _class_logits(model, a, b, model.kernel))(items, query)
    lp = jax.nn.log_softmax(logits)
    return -jnp.mean(jnp.take_along_axis(lp, target[:, None], axis=-1))


@eqx.filter_jit
def _accuracy(model, items, query, target, kernel: str):
    logits = jax.vmap(lambda a, b: _class_logits(model, a, b, kernel))(items, query)
    return jnp.sum(jnp.argmax(logits, -1) == target)


# ---------------------------------------------------------------------- training
def _optimizer(config: RetrievalConfig):
    import optax

    if config.schedule == "constant":
        return optax.adam(config.lr)
    lr = optax.warmup_cosine_decay_schedule(
        0.0,
        config.lr,
        min(config.warmup, config.max_steps - 1),
        config.max_steps,
        end_value=config.lr / 100,
    )
    return optax.adam(lr)


def _template(config: RetrievalConfig):
    model = RetrievalModel(config, jax.random.key(config.seed))
    opt_state = _optimizer(config).init(eqx.filter(model, eqx.is_array))
    return model, opt_state


def _validation_accuracy(model, config: RetrievalConfig, chunk: int = 512) -> float:
    key = jax.random.key(config.seed + 1_000_003)
    items, query, target, _ = sample_sets(key, config.val_sets, config.n_train)
    right = 0
    for a in range(0, config.val_sets, chunk):
        s = slice(a, a + chunk)
        right += int(_accuracy(model, items[s], query[s], target[s], config.kernel))
    return right / config.val_sets


@functools.lru_cache(maxsize=32)
def _steps_fn(config: RetrievalConfig) -> Callable:
    """``steps(model, opt_state, keys)``: one Adam step per key, each on a fresh batch, in
    one compiled loop (``lax.scan``; a Python loop of jitted steps spends half its time
    dispatching). Returns the model, the optimizer state and the last step's loss."""
    import optax

    opt = _optimizer(config)

    @eqx.filter_jit
    def steps(model, opt_state, keys):
        params, static = eqx.partition(model, eqx.is_array)

        def one(carry, key):
            params, opt_state = carry
            items, query, target, _ = sample_sets(key, config.batch, config.n_train)
            loss, grads = jax.value_and_grad(
                lambda p: _loss(eqx.combine(p, static), items, query, target)
            )(params)
            updates, opt_state = opt.update(grads, opt_state, params)
            return (optax.apply_updates(params, updates), opt_state), loss

        (params, opt_state), losses = jax.lax.scan(one, (params, opt_state), keys)
        return eqx.combine(params, static), opt_state, losses[-1]

    return steps


def train(
    config: RetrievalConfig,
    directory: Path,
    *,
    progress: bool = True,
    stop_after: int | None = None,
) -> dict:
    """Train (or resume training of) the model of ``config`` into ``directory``.

    Args:
        config: the configuration.
        directory: where ``config.json``, ``checkpoint.bin``, ``model.eqx`` and
            ``train.json`` go (created).
        progress: a tqdm progress bar.
        stop_after: stop (as a crash would) after this many steps of this call, leaving
            the checkpoint (for tests of resuming).

    Returns:
        The training record (also ``train.json``): steps, best validation accuracy,
        history, seconds, whether it resumed.
    """

    def validate(state: dict, model: Any, loss: float) -> tuple[bool, dict[str, str]]:
        acc = _validation_accuracy(model, config)
        state["history"].append([state["step"], loss, acc])
        better = acc > state["best"] + config.min_delta
        state["bad"] = 0 if better else state["bad"] + 1
        state["best"] = acc if better else state["best"]
        return better, dict(loss=f"{loss:.3f}", val=f"{acc:.3f}")

    run = _training.train_resumable(
        Path(directory),
        config.to_dict(),
        _template(config),
        _training.Schedule(
            config.kernel,
            config.max_steps,
            config.eval_every,
            config.checkpoint_every,
            config.seed,
            config.lr,
        ),
        _training.scanned(_steps_fn(config)),
        validate,
        lambda s: s["step"] < config.max_steps and s["bad"] < config.patience,
        progress=progress,
        stop_after=stop_after,
    )
    state, best = run.state, run.best
    if not run.finished:
        return dict(state, finished=False, resumed=run.resumed)
    if state["best"] < 0:  # fewer steps than one validation
        state["best"], best = _validation_accuracy(run.model, config), run.model
    record = dict(state, finished=True, resumed=run.resumed, config=config.to_dict())
    return _training.finish(Path(directory), best, record)


def load_or_train(
    config: RetrievalConfig, cache: Path, *, progress: bool = True, retrain: bool = False
) -> tuple[RetrievalModel, dict, bool]:
    """The trained model of ``config``: loaded from ``cache/<config.key()>`` when a
    finished model with an identical ``config.json`` is there, else trained (resuming a
    checkpoint if one is there). Returns ``(model, training record, reused)``."""
    directory = Path(cache) / config.key()
    done = directory / "train.json"
    if done.exists() and not retrain:
        model, record = load_finished(config, directory, _template(config)[0])
        return model, record, True
    record = train(config, directory, progress=progress)
    model, _ = load_finished(config, directory, _template(config)[0])
    return model, record, False


# -------------------------------------------------------------------- evaluation
@functools.lru_cache(maxsize=64)
def _eval_fn(kernels: tuple[str, ...]) -> Callable:
    """One compiled evaluation of a batch of sets under each of ``kernels``: the item and
    query embeddings are computed once and shared (a model read with several kernels,
    softmax and adaptive). Returns one ``(right, on_max, P, L)`` per kernel."""

    @eqx.filter_jit
    def run(model, items, query, target, top):
        def one(a, b):
            e, u = model.embed(a, b)
            out = []
            for kernel in kernels:
                P, L, o = head_from_embeddings(model, e, u, kernel)
                out.append((P, L, model.out_mlp(o)))
            return tuple(out)

        rows = jax.vmap(one)(items, query)
        res = []
        for P, L, logits in rows:
            right = jnp.argmax(logits, -1) == target
            on_max = jnp.take_along_axis(P, top[:, None], axis=-1)[:, 0]
            res.append((right, on_max, P, L))
        return tuple(res)

    return run


def evaluate(
    model: RetrievalModel,
    kernel: str,
    sizes: Sequence[int] = SIZES,
    *,
    seed: int = 12345,
    half_width: float = 0.02,
    min_sets: int = 512,
    max_sets: int = 4096,
    items_per_batch: int = 1 << 16,
    progress: bool = True,
) -> dict:
    """Accuracy and head diagnostics at each set size, with no parameter changed.

    For each ``n``, sets are drawn in batches of ``items_per_batch / n`` sets (memory
    bounded: ``O(items_per_batch * width)``), until the 95% Wilson interval
    (``binomial_interval``) is within ``+-half_width`` (at least ``min_sets``, at most
    ``max_sets`` sets). Diagnostics from ``attnflow.dispersion`` of the head's weights
    over the items with their logits: mean attention on the true maximum item, mean
    largest coefficient, mean logit spread ``delta`` and the mean softmax bound
    ``1/(1 + (n-1) e^{-delta})``.

    Returns:
        ``{"sizes", "accuracy", "interval", "sets", "attention_on_max", "max_coefficient",
        "delta", "bound", "seconds"}``, lists over sizes (NaN where not evaluated:
        ``selective`` past ``SELECTIVE_MAX_N``).
    """
    return evaluate_many(
        model,
        (kernel,),
        sizes,
        seed=seed,
        half_width=half_width,
        min_sets=min_sets,
        max_sets=max_sets,
        items_per_batch=items_per_batch,
        progress=progress,
    )[kernel]


_EVAL_KEYS = (
    "accuracy",
    "interval",
    "sets",
    "attention_on_max",
    "max_coefficient",
    "delta",
    "bound",
    "seconds",
)


def evaluate_many(
    model: RetrievalModel,
    kernels: Sequence[str],
    sizes: Sequence[int] = SIZES,
    *,
    seed: int = 12345,
    half_width: float = 0.02,
    min_sets: int = 512,
    max_sets: int = 4096,
    items_per_batch: int = 1 << 16,
    progress: bool = True,
) -> dict[str, dict]:
    """``evaluate`` of one model under several kernels at once: ``{kernel: result}``.

    Every kernel sees the same sets (batch ``b`` at size ``n`` is drawn from
    ``fold_in(key(seed + n), b)`` whatever the kernels) and stops on its own interval, so
    each result is that of ``evaluate`` alone; the embeddings of a batch are computed
    once for all the kernels. A batch's time is split evenly among the kernels still
    running."""
    from tqdm.auto import tqdm

    kernels = tuple(dict.fromkeys(kernels))
    out: dict[str, dict[str, list]] = {k: {f: [] for f in _EVAL_KEYS} for k in kernels}
    for n in tqdm(list(sizes), desc=f"eval {', '.join(kernels)}", disable=not progress):
        live = [k for k in kernels if not (k == "selective" and n > SELECTIVE_MAX_N)]
        for k in kernels:
            if k not in live:
                for f, v in out[k].items():
                    v.append([math.nan, math.nan] if f == "interval" else math.nan)
                out[k]["sets"][-1] = 0
        per = max(1, min(max_sets, items_per_batch // n))
        acc = {
            k: dict(right=0, total=0, on_max=0.0, mx=0.0, delta=0.0, bound=0.0, seconds=0.0)
            for k in live
        }
        # one compiled program for every kernel of this size, even after some have
        # stopped: their heads are cheap next to the shared embeddings, and a program
        # for each subset would be compiled again at every size
        read = tuple(live)
        run = _eval_fn(read)
        b = 0
        while live:
            t0 = time.perf_counter()
            key = jax.random.fold_in(jax.random.key(seed + n), b)
            b += 1
            items, query, target, top = sample_sets(key, per, n)
            done = []
            for kernel, (r, on_max, P, L) in zip(read, run(model, items, query, target, top)):
                if kernel not in live:
                    continue
                a = acc[kernel]
                Pn, Ln = np.asarray(P, np.float64), np.asarray(L, np.float64)
                if kernel == "differential":  # signed weights: the first map's spread
                    Ln = Ln[:, :n]
                    mx = Pn.max(-1)
                    delta = Ln.max(-1) - Ln.min(-1)
                else:
                    rep = dispersion(Pn, logits=Ln)
                    mx, delta = rep.max, rep.delta
                a["right"] += int(np.sum(np.asarray(r)))
                a["total"] += per
                a["on_max"] += float(np.sum(np.asarray(on_max)))
                a["mx"] += float(np.sum(mx))
                a["delta"] += float(np.sum(delta))
                a["bound"] += float(np.sum(bound_tight(delta, n)))
                if a["total"] >= max_sets:
                    done.append(kernel)
                elif a["total"] >= min_sets:
                    lo, hi = binomial_interval(int(a["right"]), int(a["total"]))
                    ratio = a["right"] / a["total"]
                    if max(hi - ratio, ratio - lo) <= half_width:
                        done.append(kernel)
            share = (time.perf_counter() - t0) / len(live)
            for kernel in live:
                acc[kernel]["seconds"] += share
            live = [k for k in live if k not in done]
        for kernel, a in acc.items():
            o, total = out[kernel], int(a["total"])
            lo, hi = binomial_interval(int(a["right"]), total)
            o["accuracy"].append(a["right"] / total)
            o["interval"].append([lo, hi])
            o["sets"].append(total)
            o["attention_on_max"].append(a["on_max"] / total)
            o["max_coefficient"].append(a["mx"] / total)
            o["delta"].append(a["delta"] / total)
            o["bound"].append(a["bound"] / total)
            o["seconds"].append(a["seconds"])
    return {k: dict(sizes=list(sizes), **v) for k, v in out.items()}


def run_study(
    kernels: Sequence[str],
    cache: Path,
    *,
    base: RetrievalConfig | None = None,
    sizes: Sequence[int] = SIZES,
    eval_kwargs: dict[str, Any] | None = None,
    progress: bool = True,
) -> dict:
    """Train (or reuse) and evaluate every kernel; ``adaptive`` reads the softmax model.

    Returns the ``figures/max_retrieval.json`` dictionary: ``sizes``, per kernel
    ``accuracy``, ``interval``, ``attention_on_max``, ``delta``, ``max_coefficient``,
    ``bound``, ``sets``, and ``training`` records, ``config``, ``paper``."""
    base = RetrievalConfig() if base is None else base
    eval_kwargs = dict(eval_kwargs or {})
    res: dict[str, Any] = {
        k: {}
        for k in (
            "accuracy",
            "interval",
            "attention_on_max",
            "delta",
            "max_coefficient",
            "bound",
            "sets",
            "eval_seconds",
            "training",
        )
    }
    models: dict[str, RetrievalModel] = {}
    for kern in kernels:
        train_kernel = EVAL_ONLY.get(kern, kern)
        if train_kernel not in models:
            params = (("lam", 0.2),) if train_kernel == "differential" else ()
            cfg = dataclasses.replace(base, kernel=train_kernel, kernel_params=params)
            model, record, reused = load_or_train(cfg, cache, progress=progress)
            models[train_kernel] = model
            res["training"][train_kernel] = dict(
                key=cfg.key(),
                reused=reused,
                steps=record["step"],
                best_validation=record["best"],
                seconds=record["seconds"],
            )
    # the rows of one trained model (softmax and adaptive) share its forward passes
    evals: dict[str, dict] = {}
    for train_kernel, model in models.items():
        rows = [k for k in kernels if EVAL_ONLY.get(k, k) == train_kernel]
        evals.update(evaluate_many(model, rows, sizes, progress=progress, **eval_kwargs))
    for kern in kernels:
        ev = evals[kern]
        for k in ("accuracy", "interval", "attention_on_max", "delta", "max_coefficient"):
            res[k][kern] = ev[k]
        res["bound"][kern] = ev["bound"]
        res["sets"][kern] = ev["sets"]
        res["eval_seconds"][kern] = ev["seconds"]
    return dict(
        sizes=list(sizes),
        **res,
        config=dict(
            base.to_dict(),
            kernel=None,
            trained_with={k: EVAL_ONLY.get(k, k) for k in kernels},
            evaluation=dict(dict(half_width=0.02, min_sets=512, max_sets=4096), **eval_kwargs),
            selective_max_n=SELECTIVE_MAX_N,
        ),
        paper=dict(softmax=PAPER_ACCURACY, adaptive=PAPER_ACCURACY_ADAPTIVE),
    )
