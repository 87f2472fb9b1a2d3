"""One resumable training loop, and the files of a finished model, for the studies that
train a model into a cache directory (max retrieval, long context, the decoder).

Contract. ``train_resumable(directory, config, template, schedule, advance, validate,
running)`` writes ``config.json`` (``config``, a JSON-ready dict), resumes from
``checkpoint.bin`` when a whole one is there (the model, the optimiser state and the best
model as one unit, with the step record: ``_checkpoint``), and trains in blocks that end
at the next validation, checkpoint, stop or the last step.
``advance(model, opt_state, base, s0, block)`` runs steps ``s0 .. s0 + block - 1``; step
``s`` must draw its batch from ``jax.random.fold_in(base, s)`` (``base`` is
``jax.random.key(schedule.seed + 17)``), so that the blocks do not change the numbers
and a resumed run is, bit for bit, the run that was never stopped.

- A loss that is not finite after a block is a ``FloatingPointError`` naming the step and
  the learning rate; the last checkpoint is kept and nothing is recorded as finished.
- A validation runs when the step is a multiple of ``schedule.eval_every`` (and at the
  last step with ``schedule.eval_at_end``): ``validate(state, model, loss)`` appends its
  row to ``state["history"]``, updates ``state["best"]`` and ``state["bad"]``, and returns
  whether ``model`` is now the best one and the progress bar's postfix.
- The checkpoint is written every ``schedule.checkpoint_every`` steps, and when
  ``stop_after`` steps of this call are done (a stop as a crash would leave it: for the
  tests of resuming).
- ``running(state)`` says whether to take another block (the step budget, the patience).

It returns a ``Run``: the step record (``step``, ``best``, ``bad``, ``history``,
``seconds`` and the caller's ``extra`` fields), the last and the best model, whether it
resumed and whether it finished. The caller then writes the finished model with
``finish`` (``model.eqx`` atomically, then ``train.json`` with its SHA-256, which marks
it finished, then the checkpoint is removed); ``read_finished`` checks
``config.json`` and ``train.json`` against the configuration and reads ``model.eqx``
against the model's template (shapes, dtypes and hash checked before equinox reads it).
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import io
import json
import math
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from ..io.files import (
    BadFile,
    json_field,
    read_bytes,
    read_json,
    read_npy_stream,
    temporary_name,
    write_atomic,
    write_text,
)
from . import _checkpoint

CHECKPOINT = "checkpoint.bin"


@dataclasses.dataclass(frozen=True)
class Schedule:
    """The step budget and rhythm of a training run.

    Attributes:
        what: the run's name in the progress bar and in errors (a kernel, a variant).
        max_steps: steps in all.
        eval_every: steps between two validations.
        checkpoint_every: steps between two checkpoints.
        seed: the seed of the batches (``key(seed + 17)``).
        lr: the peak learning rate (named when the loss diverges).
        eval_at_end: validate at ``max_steps`` too when it is not a multiple of
            ``eval_every``.
    """

    what: str
    max_steps: int
    eval_every: int
    checkpoint_every: int
    seed: int
    lr: float
    eval_at_end: bool = False


@dataclasses.dataclass
class Run:
    """What ``train_resumable`` leaves: the step record and the models."""

    state: dict[str, Any]
    model: Any
    best: Any
    resumed: bool
    finished: bool


def train_resumable(
    directory: Path,
    config: Mapping[str, Any],
    template: tuple[Any, Any],
    schedule: Schedule,
    advance: Callable[[Any, Any, Any, int, int], tuple[Any, Any, Any]],
    validate: Callable[[dict, Any, float], tuple[bool, dict[str, str]]],
    running: Callable[[dict], bool],
    *,
    progress: bool = True,
    stop_after: int | None = None,
    extra: Mapping[str, Any] | None = None,
) -> Run:
    """Train (or resume training) into ``directory``; see the module docstring.

    Args:
        directory: where ``config.json`` and ``checkpoint.bin`` go (created).
        config: the configuration as a JSON-ready dict.
        template: ``(model, opt_state)`` at step 0 (also the shapes a checkpoint is read
            into).
        schedule: the budget and rhythm.
        advance: ``(model, opt_state, base, s0, block) -> (model, opt_state, loss)``.
        validate: ``(state, model, loss) -> (model is the new best, postfix)``.
        running: ``state -> bool``, whether to take another block.
        progress: a tqdm progress bar.
        stop_after: stop after this many steps of this call, with the checkpoint written.
        extra: more fields of the step record, with their starting values.

    Returns:
        A ``Run``.
    """
    from tqdm.auto import tqdm

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    write_text(directory / "config.json", json.dumps(dict(config), indent=1))
    model, opt_state = template
    best = model
    state: dict[str, Any] = dict(step=0, best=-1.0, bad=0, history=[], seconds=0.0)
    state.update(copy.deepcopy(dict(extra or {})))  # fresh lists
    ckpt = directory / CHECKPOINT
    found = _checkpoint.load(ckpt, (model, opt_state, best))
    if found is not None:
        (model, opt_state, best), state = found
    base = jax.random.key(schedule.seed + 17)
    bar = tqdm(
        total=schedule.max_steps,
        initial=state["step"],
        disable=not progress,
        desc=f"train {schedule.what}",
    )
    t0, done_here = time.perf_counter(), 0
    try:
        while running(state):
            s0 = state["step"]
            block = min(
                schedule.eval_every - s0 % schedule.eval_every,
                schedule.checkpoint_every - s0 % schedule.checkpoint_every,
                schedule.max_steps - s0,
                *(() if stop_after is None else (stop_after - done_here,)),
            )
            model, opt_state, loss = advance(model, opt_state, base, s0, block)
            if not math.isfinite(float(loss)):
                raise FloatingPointError(
                    f"training {schedule.what!r} diverged: the loss is {float(loss)} after "
                    f"step {s0 + block} (lr = {schedule.lr}); the last checkpoint "
                    f"({ckpt.name}, step {state['step']}) is kept, nothing is recorded as "
                    f"finished. Lower lr."
                )
            state["step"] += block
            done_here += block
            bar.update(block)
            step = state["step"]
            if step % schedule.eval_every == 0 or (
                schedule.eval_at_end and step == schedule.max_steps
            ):
                better, postfix = validate(state, model, float(loss))
                if better:
                    best = model
                bar.set_postfix(postfix)
            stopping = stop_after is not None and done_here >= stop_after
            if step % schedule.checkpoint_every == 0 or stopping:
                state["seconds"] += time.perf_counter() - t0
                t0 = time.perf_counter()
                _checkpoint.save(ckpt, (model, opt_state, best), state)
            if stopping:
                return Run(state, model, best, found is not None, False)
    finally:
        bar.close()
    state["seconds"] += time.perf_counter() - t0
    return Run(state, model, best, found is not None, True)


def scanned(steps: Callable[[Any, Any, Any], tuple[Any, Any, Any]]) -> Callable:
    """The ``advance`` of a compiled ``steps(model, opt_state, keys)`` that takes one step
    per key (a ``lax.scan``): the keys of steps ``s0 .. s0 + block - 1``."""

    def advance(model: Any, opt_state: Any, base: Any, s0: int, block: int):
        keys = jax.vmap(lambda s: jax.random.fold_in(base, s))(jnp.arange(s0, s0 + block))
        return steps(model, opt_state, keys)

    return advance


def finish(directory: Path, model: Any, record: dict) -> dict:
    """Write a finished model: ``model.eqx`` (atomically), then ``train.json``, the
    record with the SHA-256 of ``model.eqx`` (``model_sha256``), which marks the model
    finished; then remove the checkpoint. Returns the record written."""
    directory = Path(directory)
    buf = io.BytesIO()
    eqx.tree_serialise_leaves(buf, model)
    blob = buf.getvalue()
    path = directory / "model.eqx"
    write_atomic(path, lambda f: f.write(blob), temporary_name(path))
    record = dict(record, model_sha256=hashlib.sha256(blob).hexdigest())
    # whole or not at all: a kill here leaves no train.json, and the rerun resumes from
    # the checkpoint (removed only below), at its last step
    write_text(directory / "train.json", json.dumps(record, indent=1))
    _checkpoint.remove(directory / CHECKPOINT)
    return record


def forget(directory: Path) -> None:
    """Remove the finished marker and the checkpoint (a retraining starts over)."""
    (Path(directory) / "train.json").unlink(missing_ok=True)
    _checkpoint.remove(Path(directory) / CHECKPOINT)


def read_finished(
    config: Mapping[str, Any],
    directory: Path,
    like: Any,
    fields: Mapping[str, Any],
    *,
    check: Callable[[dict], None] | None = None,
    hash_required: bool = True,
) -> tuple[Any, dict]:
    """The finished model in ``directory`` and its record, each file checked.

    ``config.json`` must hold ``config``; ``train.json`` must have each of ``fields``
    (name to JSON type), ``finished`` true and ``config`` equal to ``config``, and pass
    ``check`` (which raises ``ValueError`` saying what is wrong); ``model.eqx`` must match
    the recorded SHA-256 (records written before it was kept have none: allowed unless
    ``hash_required``) and ``like``'s arrays. A bad file is one ``ValueError`` naming it.
    """
    directory = Path(directory)
    fix = f"delete {str(directory)!r} or pass retrain=True to train again"
    saved = read_json(directory / "config.json", fix=fix)
    if saved != dict(config):
        raise ValueError(
            f"{str(directory / 'config.json')!r} holds a model of another configuration "
            f"({saved!r:.300}); remove {str(directory)!r} or pass retrain=True."
        )
    path = directory / "train.json"
    record = read_json(path, fix=fix)
    try:
        for name, kind in fields.items():
            json_field(record, name, kind)
        if record.get("finished") is not True or record.get("config") != saved:
            raise ValueError("it is not the record of this finished model")
        if check is not None:
            check(record)
        present = hash_required or "model_sha256" in record
        digest = json_field(record, "model_sha256", str) if present else None
    except ValueError as exc:
        raise BadFile(path, str(exc), fix=fix) from None
    return read_model(directory / "model.eqx", like, digest, fix), record


def read_model(path: Path, like: Any, digest: str | None, fix: str) -> Any:
    """``eqx.tree_deserialise_leaves(path, like)``, with the file's SHA-256 compared with
    ``digest`` (when given) and each array's ``.npy`` header checked against ``like``
    (shape, dtype, bytes left) before equinox reads it."""
    blob = read_bytes(path, fix=fix)
    if digest is not None and hashlib.sha256(blob).hexdigest() != digest:
        raise BadFile(
            path, "it does not match the SHA-256 its train.json records (damaged)", fix=fix
        )
    count = [0]

    def leaf(f, x):
        loaded = isinstance(x, (jax.Array, jax.ShapeDtypeStruct, np.ndarray))
        if not (loaded or eqx.is_array_like(x)):
            return x  # not stored (equinox's default)
        want = (tuple(x.shape), np.dtype(x.dtype)) if loaded else (np.shape(x), np.asarray(x).dtype)
        start = f.tell()
        arr = read_npy_stream(f, len(blob) - start, exact=False)
        if (arr.shape, arr.dtype) != want:
            raise ValueError(
                f"its array {count[0]} is {arr.shape} {arr.dtype}, the model needs "
                f"{want[0]} {want[1]}"
            )
        count[0] += 1
        f.seek(start)
        return eqx.default_deserialise_filter_spec(f, x)

    try:
        return eqx.tree_deserialise_leaves(io.BytesIO(blob), like, filter_spec=leaf)
    except (ValueError, TypeError, EOFError, OSError, RuntimeError) as exc:
        while isinstance(exc.__cause__, Exception):  # equinox names the leaf, then why
            exc = exc.__cause__
        raise BadFile(path, str(exc) or type(exc).__name__, fix=fix) from None
