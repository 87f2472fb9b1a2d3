"""Tier B of the long-context study: a small causal decoder trained on associative recall
with absent keys, QK norm off or on, with or without a learned sink and an output gate.

The question (Bertsch et al. 2026, "Cracks in the Foundation"): to retrieve one token
among many a head needs a large logit gap, and to do nothing it needs a sink far above
the rest; QK norm bounds the spread of the logits by its gains, and so takes away both.
Does a learned sink or an output gate give a QK-norm model back what it loses?

The task (``_decoder_task``, where every choice is stated): multi-query associative
recall with absent keys. ``BOS``, a context of filler tokens holding ``pairs = 8``
adjacent key-value pairs at random places, then ``queries = 8`` query keys, half of them
keys that occur nowhere (answer ``NULL``); 32 keys, 32 values, 16 fillers (a vocabulary
of 82). Trained at length 64 (39 fillers), read at 64, 256, 1024, 4096 with the pairs
and queries unchanged and the filler growing. The answer of a query is read from the
output at its own position; the loss is the cross-entropy of the answers only.

The network (``_decoder_model``): ``layers = 2`` layers of width ``d_model = 64`` with
``heads = 2`` heads of size 32, no positional encoding (the only order is the causal
mask and the convolution), tied input and output embeddings (the output logits are
``RMSNorm(x) E^T / sqrt(d)``, T5's scaling of a tied head). Each layer, pre-norm
(RMSNorm, epsilon 1e-6, learned gains) and residual:

    x <- x + conv(RMSNorm(x))               causal depthwise convolution, 4 taps
    u  = RMSNorm(x)
    x <- x + W_O [g_h(u_i) sum_j P^h_ij W_V^h u_j]_h      heads h = 1, 2
    x <- x + W_2 gelu(W_1 RMSNorm(x))       MLP of width 256 (tanh GELU)

where ``P^h = kernel(beta <W_Q^h u_i, W_K^h u_j>)`` under the causal mask,
``beta = 1/sqrt(32)``. The convolution lets a value token hold its key (lag one), so
that one head can match a query to it. The kernel of each head is an attnflow kernel
object, a trainable leaf: ``"plain"`` ``Softmax``; ``"qknorm"`` ``QKNorm(wq, wk)``
(queries and keys RMS-normalised per head, times learned per-channel gains, one pair per
layer and head, as Olmo and Qwen place them; no epsilon); ``+sink``: ``Sink(b)`` /
``QKNormSink(wq, wk, b)``, a learned logit ``b`` per head for an extra softmax column
with no value (initial 0); ``+gate``: a head-wise sigmoid gate ``g_h(u_i) =
sigmoid(W_g^h u_i + b_g^h)`` on the head's output before ``W_O`` (Qiu et al. 2025,
position G1, from the normalised input of the query token; head-wise, so that each head
with its gate is exactly ``attnflow.GatedAttention``). The controls ``"sink"``,
``"gate"``, ``"sink+gate"`` (no QK norm) are accepted too.

Training: float32, AdamW (beta 0.9, 0.999; decoupled weight decay 0.1 of the matrices:
embedding, projections, MLP, gate weights; no decay of gains, convolutions, sink logits
and biases), gradient norm clipped to 1, learning rate 3e-3 with a linear warm-up of 100
steps and a cosine decay to 3e-5 at ``max_steps``, batches of 64 fresh sequences (step
``s`` draws ``fold_in(key(seed + 17), s)``). A fixed budget of ``max_steps = 1500``
steps by default; every ``eval_every = 250`` steps and at the end the accuracy on a
fixed validation set (512 sequences of length 64, seed ``seed + 1000003``) is measured,
and the kept model is the latest whose validation accuracy is within ``min_delta`` of
the best (the last one, unless the accuracy fell); ``patience`` and ``stop_accuracy``
stop earlier when set (the quick configuration stops at 0.99). Checkpoints every
``checkpoint_every`` steps (``_checkpoint``) make a killed run resume bit for bit.
Finished models are cached in ``cache_dir/<variant>-<hash>/`` with ``config.json``,
``model.eqx`` and ``train.json`` and reused only through the checks of
``_retrieval_model.load_finished`` (the configuration, the record's fields, the hash of
``model.eqx``, each array's shape and dtype).

The record (``train.json``, and the second value of ``load_or_train_decoder``): the
retrieval study's fields (``step``, ``best``, ``bad``, ``history`` of ``[step, loss,
validation accuracy]``, ``seconds``, ``finished``, ``resumed``, ``config``,
``model_sha256``) and ``history_split`` (``[step, present, absent]`` accuracies),
``accuracy``, ``accuracy_present``, ``accuracy_absent`` of the kept model on the
validation set, per head (``heads``) the mean first-token, sink and needle masses and
gates on the answer rows with the learned QK-norm gains, their logit bound
``beta p max|wq| max|wk|``, sink logit and gate parameters, and ``sink_formed``: whether
any head has a sink, a head's mean first-token mass or learned-sink share on the
answer rows above ``SINK_THRESHOLD = 0.3`` (Gu et al. 2025, arXiv 2410.10781).

Evaluation (``evaluate_decoder``): ``sequences`` fresh sequences of one length (chunk
``c`` drawn from ``fold_in(key(seed), c)``), every answer read, and per layer, head and
query the statistics of the answer row of ``attnflow.networks._readout.AttentionReadout``:
there ``needle`` is the value token of the queried pair, ``first_mass`` the weight on
BOS, ``sink_mass`` the learned sink's share, ``logit_spread`` and ``needle_gap`` are on
the logits as the kernel receives them (after ``logit_scale``; the sink logit is not
scaled), ``gate`` the head's gate. The long-context study runs each trained head as a
particle system (``attnflow.studies._decoder_dynamics.heads_through_dynamics``).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from . import _training
from ._decoder_model import Decoder, RowParts, forward
from ._decoder_task import ALL_VARIANTS, VARIANTS, DecoderConfig, RecallBatch, sample_batch
from ._readout import ROW_FIELDS, AttentionReadout
from ._retrieval_model import load_finished

__all__ = [
    "VARIANTS",
    "ALL_VARIANTS",
    "LENGTHS",
    "SINK_THRESHOLD",
    "DecoderConfig",
    "Decoder",
    "sample_batch",
    "train_decoder",
    "load_or_train_decoder",
    "evaluate_decoder",
]

LENGTHS = (64, 256, 1024, 4096)
SINK_THRESHOLD = 0.3
VALIDATION_SEED = 1_000_003  # added to the config's seed
_BLOCK = 512  # query rows per tile of the full-length layers
_LOGITS_PER_CHUNK = 1 << 23  # logits of one head held at once by an evaluation chunk


# ----------------------------------------------------------------------- readout
def _row_stats(rp: RowParts, rows: Any, needle: Any, present: Any) -> dict[str, Any]:
    """The ``ROW_FIELDS`` of one head's answer rows (``rows`` their positions)."""
    L, P = rp.L, rp.P
    cols = jnp.arange(L.shape[-1], dtype=jnp.int32)
    keep = cols[None, :] <= rows[:, None]
    on = cols[None, :] == jnp.maximum(needle, 0)[:, None]
    zero = jnp.zeros_like(rp.sink)
    top = jnp.max(jnp.where(keep, L, -jnp.inf), axis=-1)
    low = jnp.min(jnp.where(keep, L, jnp.inf), axis=-1)
    other = jnp.max(jnp.where(keep & ~on, L, -jnp.inf), axis=-1)
    xlogy = jax.scipy.special.xlogy
    return dict(
        entropy=-jnp.sum(xlogy(P, P), axis=-1) - xlogy(rp.sink, rp.sink),
        first_mass=P[:, 0],
        sink_mass=rp.sink,
        needle_mass=jnp.where(present, jnp.sum(jnp.where(on, P, 0.0), axis=-1), zero),
        logit_spread=top - low,
        needle_gap=jnp.where(present, jnp.sum(jnp.where(on, L, 0.0), axis=-1) - other, zero),
        gate=rp.gate,
    )


@functools.lru_cache(maxsize=64)
def _eval_fn(q: int, parts: bool) -> Callable:
    """``run(model, batch, scale)``: the right answers ``(b, q)`` and, with ``parts``, the
    stacked row statistics ``{field: (b, L, H, q)}`` of a batch, one compiled call."""

    @eqx.filter_jit
    def run(model, batch: RecallBatch, scale):
        n = batch.tokens.shape[1]
        rows = jnp.arange(n - q, n, dtype=jnp.int32)

        def one(tokens, targets, present, needle):
            logits, layers = forward(model, tokens, q, scale, block=_BLOCK, parts=parts)
            right = jnp.argmax(logits, axis=-1) == targets
            if not parts:
                return right, {}
            per = [[_row_stats(rp, rows, needle, present) for rp in heads] for heads in layers]
            stats = {
                f: jnp.stack([jnp.stack([h[f] for h in lay]) for lay in per]) for f in ROW_FIELDS
            }
            return right, stats

        return jax.vmap(one)(batch.tokens, batch.targets, batch.present, batch.needle)

    return run


def _batches(
    config: DecoderConfig, length: int, sequences: int, seed: int
) -> Iterator[tuple[RecallBatch, int]]:
    """Chunks of ``per = min(sequences, _LOGITS_PER_CHUNK / (length * tile))`` sequences,
    chunk ``c`` drawn from ``fold_in(key(seed), c)``, each with how many of its sequences
    to keep (all but in the last chunk): every chunk has one size, so one compilation
    serves them all, and ``sequences`` are kept in all."""
    per = max(1, min(sequences, _LOGITS_PER_CHUNK // (length * min(length, _BLOCK))))
    for c in range(-(-sequences // per)):
        batch = sample_batch(jax.random.fold_in(jax.random.key(seed), c), config, per, length)
        yield batch, min(per, sequences - c * per)


def _check_model(model: Any, config: DecoderConfig) -> None:
    if not isinstance(model, Decoder):
        raise ValueError(
            f"model must be a Decoder (load_or_train_decoder); got {type(model).__name__}."
        )
    if not isinstance(config, DecoderConfig):
        raise ValueError(f"config must be a DecoderConfig; got {type(config).__name__}.")
    if len(model.layers) != config.layers or model.embed.shape != (config.vocab, config.d_model):
        raise ValueError(
            f"model does not have the shape of config ({config.layers} layers, vocabulary "
            f"{config.vocab}, width {config.d_model}): pass the config it was trained with."
        )


def evaluate_decoder(
    model: Decoder,
    config: DecoderConfig,
    length: int,
    *,
    sequences: int,
    seed: int,
    logit_scale: float = 1.0,
) -> AttentionReadout:
    """Read ``sequences`` fresh sequences of ``length`` tokens: every answer, and the
    statistics of every layer's and head's answer rows (``AttentionReadout``).

    Args:
        model: a trained ``Decoder`` (``load_or_train_decoder``).
        config: its configuration (the task: pairs, queries, vocabularies).
        length: the sequence length (at least ``2 + 2 pairs + queries``).
        sequences: how many sequences (``m = sequences * queries`` answers).
        seed: the data seed (chunk ``c`` of the sequences from ``fold_in(key(seed), c)``).
        logit_scale: multiplies every attention logit of every layer (e.g.
            ``log(length) / log(train_length)``); the learned sink logit is not scaled.

    Returns:
        An ``AttentionReadout`` of shape ``(layers, heads, m)``, answers in sequence order
        (the ``queries`` answers of sequence 0 first). The arithmetic is that of the
        model's arrays (float32 as trained).

    Example:
        >>> import jax
        >>> from attnflow.networks._decoder import Decoder, DecoderConfig, evaluate_decoder
        >>> config = DecoderConfig.quick("qknorm+sink")
        >>> model = Decoder(config, jax.random.key(0))  # untrained
        >>> out = evaluate_decoder(model, config, 48, sequences=3, seed=1)
        >>> out.shape, int(out.present.sum()), out.visible[:2].tolist()
        ((2, 2, 12), 6, [45, 46])
    """
    _check_model(model, config)
    length = config.min_length(length)
    for name, v in (("sequences", sequences), ("seed", seed)):
        if isinstance(v, bool) or not isinstance(v, int) or v < (1 if name == "sequences" else 0):
            raise ValueError(
                f"{name} must be a whole number >= {1 if name == 'sequences' else 0}; got {v!r}."
            )
    if isinstance(logit_scale, bool) or not (
        isinstance(logit_scale, (int, float)) and math.isfinite(logit_scale) and logit_scale > 0
    ):
        raise ValueError(f"logit_scale must be a finite number > 0; got {logit_scale!r}.")
    q = config.queries
    run = _eval_fn(q, True)
    scale = jnp.asarray(logit_scale, model.embed.dtype)
    right, present, stats = [], [], {f: [] for f in ROW_FIELDS}
    with jax.numpy_dtype_promotion("standard"):
        for batch, keep in _batches(config, length, sequences, seed):
            r, st = run(model, batch, scale)
            right.append(np.asarray(r)[:keep].reshape(-1))
            present.append(np.asarray(batch.present)[:keep].reshape(-1))
            for f in ROW_FIELDS:  # (b, L, H, q) -> (L, H, b q)
                a = np.asarray(st[f], np.float64)[:keep]
                stats[f].append(a.transpose(1, 2, 0, 3).reshape(a.shape[1], a.shape[2], -1))
    m = sequences * q
    visible = np.tile(np.arange(length - q, length) + 1, sequences)
    return AttentionReadout(
        length=length,
        correct=np.concatenate(right),
        present=np.concatenate(present),
        visible=visible.astype(np.int64)[:m],
        **{f: np.concatenate(v, axis=-1) for f, v in stats.items()},
    ).check()


# ---------------------------------------------------------------------- training
def _decay_mask(params: Any) -> Any:
    """True on the decayed leaves: the embedding, the projections, MLP and gate weights."""
    mask = jax.tree.map(lambda _: False, params)

    def where(m):
        out = [m.embed]
        for lay in m.layers:
            out += [lay.Wq, lay.Wk, lay.Wv, lay.Wo, lay.W1, lay.W2]
            out += [] if lay.Wg is None else [lay.Wg]
        return out

    return eqx.tree_at(where, mask, replace_fn=lambda _: True)


def _optimizer(config: DecoderConfig):
    import optax

    lr = optax.warmup_cosine_decay_schedule(
        0.0,
        config.lr,
        min(config.warmup, config.max_steps - 1),
        config.max_steps,
        end_value=config.lr / 100,
    )
    adamw = optax.adamw(lr, weight_decay=config.weight_decay, mask=_decay_mask)
    return optax.chain(optax.clip_by_global_norm(config.clip), adamw)


def _template(config: DecoderConfig):
    model = Decoder(config, jax.random.key(config.seed))
    with jax.numpy_dtype_promotion("standard"):
        opt_state = _optimizer(config).init(eqx.filter(model, eqx.is_inexact_array))
    return model, opt_state


def _loss(model: Decoder, batch: RecallBatch, q: int):
    logits = jax.vmap(lambda t: forward(model, t, q, parts=False)[0])(batch.tokens)
    lp = jax.nn.log_softmax(logits)
    return -jnp.mean(jnp.take_along_axis(lp, batch.targets[..., None], axis=-1))


@functools.lru_cache(maxsize=32)
def _step_fn(config: DecoderConfig) -> Callable:
    """``step(params, opt_state, key)``: one AdamW step on the fresh batch of ``key``,
    compiled once per configuration (a loop of these, not a ``lax.scan`` of a block of
    steps: blocks of every length would each compile the whole step again, and at this
    size a step outweighs its dispatch). Returns the parameters, the optimizer state
    and the loss."""
    import optax

    opt = _optimizer(config)
    static = eqx.partition(_template(config)[0], eqx.is_inexact_array)[1]

    @jax.jit
    def step(params, opt_state, key):
        batch = sample_batch(key, config, config.batch, config.train_length)
        loss, grads = jax.value_and_grad(
            lambda p: _loss(eqx.combine(p, static), batch, config.queries)
        )(params)
        updates, opt_state = opt.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return step


def _validation(model: Decoder, config: DecoderConfig) -> tuple[float, float, float]:
    """``(accuracy, present, absent)`` on the validation set."""
    run = _eval_fn(config.queries, False)
    right, present = [], []
    seed = config.seed + VALIDATION_SEED
    for batch, keep in _batches(config, config.train_length, config.val_sequences, seed):
        right.append(np.asarray(run(model, batch, jnp.asarray(1.0, model.embed.dtype))[0])[:keep])
        present.append(np.asarray(batch.present)[:keep])
    r, p = np.concatenate(right).reshape(-1), np.concatenate(present).reshape(-1)
    return float(r.mean()), float(r[p].mean()), float(r[~p].mean())


def _head_record(model: Decoder, config: DecoderConfig) -> dict[str, Any]:
    """Accuracies and per-head masses, gates and learned parameters on the validation set."""
    out = evaluate_decoder(
        model,
        config,
        config.train_length,
        sequences=config.val_sequences,
        seed=config.seed + VALIDATION_SEED,
    )
    p = out.present
    heads = []
    for i, layer in enumerate(model.layers):
        for h, kernel in enumerate(layer.kernels):
            mean = {
                f: float(getattr(out, f)[i, h].mean())
                for f in ("first_mass", "sink_mass", "entropy")
            }
            row: dict[str, Any] = dict(layer=i, head=h, **mean)
            for part, sel in (("present", p), ("absent", ~p)):
                for f in ("first_mass", "sink_mass", "needle_mass", "gate", "logit_spread"):
                    if part == "absent" and f == "needle_mass":
                        continue
                    row[f"{f}_{part}"] = float(getattr(out, f)[i, h][sel].mean())
            row["bos_sink"] = mean["first_mass"] > SINK_THRESHOLD
            row["learned_sink"] = mean["sink_mass"] > SINK_THRESHOLD
            row["sink"] = row["bos_sink"] or row["learned_sink"]
            if hasattr(kernel, "wq"):
                wq, wk = np.asarray(kernel.wq, np.float64), np.asarray(kernel.wk, np.float64)
                row.update(wq=wq.tolist(), wk=wk.tolist())
                row["logit_bound"] = (
                    model.beta * config.head_size * float(np.abs(wq).max() * np.abs(wk).max())
                )
            if hasattr(kernel, "b"):
                row["sink_logit"] = float(kernel.b)
            if layer.Wg is not None and layer.bg is not None:
                row["gate_bias"] = float(layer.bg[h])
                row["gate_weight_norm"] = float(jnp.linalg.norm(layer.Wg[h]))
            heads.append(row)
    return dict(
        accuracy=float(out.correct.mean()),
        accuracy_present=float(out.correct[p].mean()),
        accuracy_absent=float(out.correct[~p].mean()),
        heads=heads,
        sink_formed=any(r["sink"] for r in heads),
        sink_heads=[[r["layer"], r["head"]] for r in heads if r["sink"]],
        sink_threshold=SINK_THRESHOLD,
    )


def train_decoder(
    config: DecoderConfig, directory: Path, *, progress: bool = True, stop_after: int | None = None
) -> dict:
    """Train (or resume training of) the decoder of ``config`` into ``directory``.

    Args:
        config: the configuration.
        directory: where ``config.json``, ``checkpoint.bin``, ``model.eqx`` and
            ``train.json`` go (created).
        progress: a tqdm progress bar.
        stop_after: stop (as a crash would) after this many steps of this call, leaving
            the checkpoint (for tests of resuming).

    Returns:
        The training record (``train.json``; see the module docstring).
    """
    step_fn = _step_fn(config)

    def advance(model: Any, opt_state: Any, base: Any, s0: int, block: int):
        params, static = eqx.partition(model, eqx.is_inexact_array)
        loss = jnp.nan
        for s in range(s0, s0 + block):
            params, opt_state, loss = step_fn(params, opt_state, jax.random.fold_in(base, s))
        return eqx.combine(params, static), opt_state, loss

    def validate(state: dict, model: Any, loss: float) -> tuple[bool, dict[str, str]]:
        acc, pres, absent = _validation(model, config)
        state["history"].append([state["step"], loss, acc])
        state["history_split"].append([state["step"], pres, absent])
        state["bad"] = 0 if acc > state["best"] + config.min_delta else state["bad"] + 1
        latest_best = acc >= state["best"] - config.min_delta  # the latest of the best
        state["best"] = max(state["best"], acc)
        return latest_best, dict(loss=f"{loss:.3f}", present=f"{pres:.3f}", absent=f"{absent:.3f}")

    def running(state: dict) -> bool:
        last = state["history"][-1][2] if state["history"] else -1.0
        reached = config.stop_accuracy is not None and last >= config.stop_accuracy
        patient = config.patience is None or state["bad"] < config.patience
        return state["step"] < config.max_steps and patient and not reached

    schedule = _training.Schedule(
        config.variant,
        config.max_steps,
        config.eval_every,
        config.checkpoint_every,
        config.seed,
        config.lr,
        eval_at_end=True,
    )
    with jax.numpy_dtype_promotion("standard"):
        run = _training.train_resumable(
            Path(directory),
            config.to_dict(),
            _template(config),
            schedule,
            advance,
            validate,
            running,
            progress=progress,
            stop_after=stop_after,
            extra={"history_split": []},
        )
        if not run.finished:
            return dict(run.state, finished=False, resumed=run.resumed)
        extra = _head_record(run.best, config)
    record = dict(run.state, finished=True, resumed=run.resumed, config=config.to_dict(), **extra)
    return _training.finish(Path(directory), run.best, record)


def load_or_train_decoder(
    config: DecoderConfig, cache_dir: Path, *, retrain: bool = False, progress: bool = True
) -> tuple[Decoder, dict]:
    """The trained decoder of ``config`` and its record.

    Loaded from ``cache_dir/<config.key()>`` when a finished model of this exact
    configuration is there (every file checked: a damaged one is a ``ValueError`` naming
    it), else trained, resuming a checkpoint when one is there (``retrain=True``
    discards both and trains from the start). The record has ``reused`` added (not
    saved).

    Example:
        >>> import tempfile
        >>> from attnflow.networks._decoder import DecoderConfig, load_or_train_decoder
        >>> config = DecoderConfig.quick("plain")
        >>> cache = tempfile.mkdtemp()
        >>> model, record = load_or_train_decoder(config, cache, progress=False)  # doctest: +SKIP
        >>> record["accuracy"] > 0.9, record["reused"]  # doctest: +SKIP
        (True, False)
        >>> load_or_train_decoder(config, cache, progress=False)[1]["reused"]  # doctest: +SKIP
        True
    """
    if not isinstance(config, DecoderConfig):
        raise ValueError(f"config must be a DecoderConfig; got {type(config).__name__}.")
    directory = Path(cache_dir).expanduser() / config.key()
    if retrain:
        _training.forget(directory)
    if (directory / "train.json").exists():
        model, record = load_finished(config, directory, _template(config)[0])  # pyright: ignore[reportArgumentType]
        return model, dict(record, reused=True)  # pyright: ignore[reportReturnType]
    train_decoder(config, directory, progress=progress)
    model, record = load_finished(config, directory, _template(config)[0])  # pyright: ignore[reportArgumentType]
    return model, dict(record, reused=False)  # pyright: ignore[reportReturnType]
