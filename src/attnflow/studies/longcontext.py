"""The long-context test of QK norm with a sink or a gate (Bertsch et al. 2026's open test).

QK norm bounds a head's logit spread by its weights, and with it the logit gap a needle
can have over ``n`` keys and the height a sink can stand above them. The study trains
models with and without QK norm, and with QK norm plus a learned sink, an output gate or
both, at one length, reads them at 1x to 256x that length, and applies the decision
rule of docs/longcontext.md (``decide``, ``RULE``).

Tier A (``attnflow.networks._longcontext_task``): one head over a set of key-value
items, the query present once or absent (answer NULL); variants ``VARIANTS``. Tier B
(``attnflow.networks._decoder``): a small causal decoder, its ``VARIANTS``, read through
``evaluate_decoder`` and ``heads_through_dynamics`` (``_decoder_dynamics``). Both return
``AttentionReadout``s (``attnflow.networks._readout``), summarised per reading by
``_longcontext_stats`` and across seeds by ``_longcontext_rule``.

Contract. ``run_study`` trains or reuses every model (cached under ``cache_dir``, an
interrupted training resumed bit for bit), reads each at every length of its tier
(``reading="plain"``; QK-norm variants also ``"scaled"``: logits times
``log(n)/log(n_train)``; a model's readings are kept beside it and reused while the
model, the reading settings and the reading code are the same; the whole study runs
with JAX's x64 mode off, whatever the caller's, as its models are float32), and returns a
``LongContextResult``: per model its seed, config, training record, learned parameters
(tier B: its heads through the dynamics) and per-length statistics; per tier and reading,
per variant and half, the accuracy of every seed, their mean with its 95% t interval
across seeds, the pooled rows (a description), the halving length and the mean
entropy, sink and needle masses; the fits of accuracy on sink mass and on entropy; the
dispersion-cap check; the rule's decision. ``LongContextResult.save`` writes it as JSON
and ``load`` reads it back.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np

from ..dynamics import kernels as _kernels
from ..networks._longcontext_task import (
    VARIANTS,
    NeedleConfig,
    NeedleModel,
    evaluate,
    load_or_train,
    sample_needles,
    train,
    validation,
)
from ._longcontext_rule import (
    BASELINE,
    RULE,
    across_seeds,
    decide,
    fit_line,
    halving_length,
    summarise,
)
from ._longcontext_stats import readout_stats

__all__ = [
    "VARIANTS",
    "NeedleConfig",
    "NeedleModel",
    "sample_needles",
    "train",
    "load_or_train",
    "evaluate",
    "validation",
    "learned",
    "readout_stats",
    "halving_length",
    "fit_line",
    "decide",
    "across_seeds",
    "RULE",
    "FACTORS",
    "LongContextResult",
    "run_study",
    "tier_setup",
]

FACTORS = (1, 4, 16, 64, 256)  # lengths read, in multiples of the training length


def _decoder():
    try:
        from ..networks import _decoder as D  # pyright: ignore[reportAttributeAccessIssue]
    except ModuleNotFoundError as exc:
        if exc.name != "attnflow.networks._decoder":
            raise
        raise ValueError(
            "tier 'B' needs attnflow.networks._decoder (the small causal decoder), which is "
            "not in this installation; run tier 'A' only (--tier A)."
        ) from None
    return D


def tier_setup(tier: str, quick: bool) -> dict[str, Any]:
    """A tier's variants, its configuration maker ``make(variant, seed)``, training
    length, lengths read and sequences per length."""
    if tier == "A":
        make = NeedleConfig.quick if quick else (lambda v, s: NeedleConfig(variant=v, seed=s))
        n0 = make(VARIANTS[0], 0).n_train
        factors = FACTORS[:4] if quick else FACTORS
        return dict(
            variants=VARIANTS,
            make=make,
            train_length=n0,
            lengths=[n0 * f for f in factors],
            sequences=512 if quick else 4096,
        )
    if tier == "B":
        D = _decoder()
        make = D.DecoderConfig.quick if quick else (lambda v, s: D.DecoderConfig(variant=v, seed=s))
        n0 = int(make(D.VARIANTS[0], 0).train_length)
        return dict(
            variants=tuple(D.VARIANTS),
            make=make,
            train_length=n0,
            lengths=[n0 * f for f in FACTORS[:4]],
            sequences=32 if quick else 256,
        )
    raise ValueError(f"tier must be 'A' or 'B'; got {tier!r}.")


@dataclasses.dataclass
class LongContextResult:
    """What ``run_study`` returns (a plain-JSON dict in ``data``; see the module
    docstring): ``data["models"]`` (one dict per trained model), ``data["tiers"]``
    (per tier: ``summary``, ``fits``, ``cap``, ``decision``, ``verdict``),
    ``data["settings"]``."""

    data: dict[str, Any]

    def save(self, path: str | Path) -> Path:
        """Write the result as JSON to ``path``, whole or not at all (a failed write, a
        full disk say, leaves the file that was there as it was); returns the path."""
        from ..io.files import write_text

        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        return write_text(path, json.dumps(self.data, indent=1, allow_nan=False) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> LongContextResult:
        """The result saved at ``path`` (a ``ValueError`` naming the file when it is not
        one)."""
        from ..io.files import read_json

        data = read_json(path, kind="long-context result")
        for key in ("models", "tiers", "settings"):
            if key not in data:
                raise ValueError(f"{str(path)!r} is not a long-context result (no {key!r}).")
        return cls(data)

    def verdict(self, tier: str) -> str:
        """The rule's verdict for ``tier`` in one sentence."""
        return str(self.data["tiers"][tier]["verdict"])

    def accuracy(
        self, tier: str, variant: str, half: str = "all", reading: str = "plain"
    ) -> list[float | None]:
        """Pooled accuracy of ``variant`` at each length of the tier."""
        return self.data["tiers"][tier]["summary"][reading][variant][half]["accuracy"]


def learned(model: NeedleModel) -> dict[str, Any]:
    """The kernel's learned parameters and the gate's bias, JSON-ready: QK-norm gains
    (mean, min, max each) and their logit bound ``beta w max|wq| max|wk|``, the sink
    logit ``b``, ssmax's ``s``."""
    k = model.kernel
    out: dict[str, Any] = {"kernel": k.describe()}
    if isinstance(k, (_kernels.QKNorm, _kernels.QKNormSink)) and k.wq is not None:
        for name in ("wq", "wk"):
            a = np.asarray(getattr(k, name), np.float64)
            out[name] = dict(mean=float(a.mean()), min=float(a.min()), max=float(a.max()))
        w = model.Wq.shape[0]
        out["logit_bound"] = _kernels.qknorm_logit_bound(k, 1.0 / math.sqrt(w), w)
    if isinstance(k, _kernels.QKNormSink):
        out["b"] = float(k.b)
    if isinstance(k, _kernels.SSMax):
        out["s"] = float(k.s)
    if model.bg is not None:
        out["gate_bias_mean"] = float(np.mean(np.asarray(model.bg)))
    return out


# bump when the entry that ``_read`` builds changes shape or meaning
READING_FORMAT = 2
EVAL_SEED = 12345  # the default sets every model is read on (the same for every variant and seed)
# package sources that do not compute a reading: a change there keeps the kept readings
_NOT_READING = ("experiments/", "cli/", "studies/longcontext.py", "studies/_longcontext_rule.py")


def _reading_digest() -> str:
    """sha256 of the package's sources that compute a reading (training, the forward
    passes, the statistics of a reading, the dynamics of the heads)."""
    from .._meta import source_digest

    return source_digest(exclude=_NOT_READING)


def _train_and_read(
    tier: str,
    setup: dict,
    variant: str,
    seed: int,
    cache: Path,
    *,
    retrain: bool,
    progress: bool,
    scaled: bool,
    dynamics: bool,
    code: str,
    eval_seed: int,
) -> dict[str, Any]:
    from .._meta import run_metadata
    from ..io.files import read_json, write_text

    cfg = setup["make"](variant, seed)
    n0, lengths, m = setup["train_length"], setup["lengths"], setup["sequences"]
    entry: dict[str, Any] = dict(
        tier=tier,
        variant=variant,
        seed=seed,
        config=cfg.to_dict() if hasattr(cfg, "to_dict") else dataclasses.asdict(cfg),
    )
    heads: Callable[[], list[dict]] | None = None  # tier B: its heads through the dynamics
    if tier == "A":
        model, record, reused = load_or_train(cfg, cache / "A", progress=progress, retrain=retrain)
        entry.update(record=record, reused=reused, learned=learned(model))
        folder = cache / "A" / cfg.key()

        def read(n: int, scale: float):
            return evaluate(model, cfg, n, sequences=m, seed=eval_seed, logit_scale=scale)
    else:
        D = _decoder()
        model, record = D.load_or_train_decoder(
            cfg, cache / "B", retrain=retrain, progress=progress
        )
        folder = cache / "B" / cfg.key()

        def read(n: int, scale: float):
            return D.evaluate_decoder(model, cfg, n, sequences=m, seed=eval_seed, logit_scale=scale)

        from ._decoder_dynamics import heads_through_dynamics

        heads = functools.partial(heads_through_dynamics, model, cfg)
        entry.update(record=record)
    kinds = ["plain"] + (["scaled"] if scaled and variant.startswith("qknorm") else [])
    versions = run_metadata()
    key = dict(
        format=READING_FORMAT,
        model_sha256=record.get("model_sha256"),
        lengths=list(lengths),
        sequences=m,
        eval_seed=eval_seed,
        readings=kinds,
        dynamics=bool(dynamics and heads is not None),
        code=code,
        versions={k: versions.get(k) for k in ("jax", "jaxlib", "numpy", "x64")},
    )
    import hashlib

    key = json.loads(json.dumps(key, sort_keys=True, default=str))
    name = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()
    kept = folder / f"readings-{name[:16]}.json"
    if kept.exists() and not retrain and key["model_sha256"] is not None:
        try:
            saved = read_json(kept, kind="kept readings")
        except ValueError:
            saved = None
        if isinstance(saved, dict) and saved.get("key") == key:
            entry.update(saved["entry"], readings_reused=True)
            return entry
    new: dict[str, Any] = {}
    if heads is not None and dynamics:
        new["heads"] = heads()
    readings = {"plain": [readout_stats(read(n, 1.0)) for n in lengths]}
    if "scaled" in kinds:
        readings["scaled"] = [readout_stats(read(n, math.log(n) / math.log(n0))) for n in lengths]
    new["readings"] = readings
    new = json.loads(json.dumps(new, allow_nan=False))
    if key["model_sha256"] is not None:
        folder.mkdir(parents=True, exist_ok=True)
        write_text(kept, json.dumps(dict(key=key, entry=new)) + "\n")
    entry.update(new, readings_reused=False)
    return entry


def run_study(
    tiers: Sequence[str] = ("A", "B"),
    *,
    quick: bool = False,
    seeds: int | Sequence[int] = 5,
    cache_dir: str | Path,
    out: str | Path | None = None,
    filename: str = "longcontext.json",
    variants: Sequence[str] | None = None,
    descriptive_seeds: int | None = 2,
    eval_seed: int = EVAL_SEED,
    retrain: bool = False,
    progress: bool = True,
) -> LongContextResult:
    """Train (or reuse) and read every model of ``tiers``; aggregate, decide, save.

    Args:
        tiers: ``"A"`` (one head, needle or null) and/or ``"B"`` (the decoder).
        quick: tiny configurations (seconds a model; for tests).
        seeds: the training seeds of every variant: a count ``k`` (seeds ``0 .. k-1``)
            or the seeds themselves (distinct whole numbers >= 0). The rule needs two or
            more; its intervals are across seeds.
        cache_dir: where trained models are kept (``A/`` and ``B/``), reused when their
            configuration matches, resumed when their training was interrupted; each
            model's readings are kept beside it and reused while the model, the reading
            settings and the reading code are unchanged.
        out: when given, the result is written to ``out/<filename>``.
        filename: the result's file name in ``out``.
        variants: the variants to train (default: all); each tier keeps those it has
            (the rule needs its baseline, ``qknorm`` and the candidates).
        descriptive_seeds: how many of the seeds (the first ones) also get the readings
            outside the rule: the QK-norm variants read with their logits times
            ``log(n)/log(n_train)``, and tier B's trained heads run as particle systems
            (``heads_through_dynamics``); ``None``: every seed, ``0``: none.
        eval_seed: the seed of the sets every model is read on (the same sets for every
            variant and training seed; another seed, other sets).
        retrain: train again even where a finished model is cached.
        progress: progress bars.

    Returns:
        The ``LongContextResult``.

    Example:
        >>> import tempfile
        >>> from attnflow.studies.longcontext import run_study
        >>> res = run_study(("A",), quick=True, seeds=1, variants=("softmax",),
        ...                 cache_dir=tempfile.mkdtemp(), progress=False)
        >>> settings, tier = res.data["settings"], res.data["tiers"]
        >>> settings["tier_A"].get("lengths"), tier["A"].get("cap").get("cap_ok")
        ([16, 64, 256, 1024], True)
        >>> res.accuracy("A", "softmax", "present")[0] > 0.9  # at the training length
        True
    """
    from tqdm.auto import tqdm

    from .._meta import run_metadata

    tiers = tuple(dict.fromkeys(tiers))
    if not tiers or any(t not in ("A", "B") for t in tiers):
        raise ValueError(f"tiers must be a non-empty selection of 'A' and 'B'; got {tiers!r}.")
    seed_list = _seed_list(seeds)
    if descriptive_seeds is not None and (
        isinstance(descriptive_seeds, bool)
        or not isinstance(descriptive_seeds, int)
        or descriptive_seeds < 0
    ):
        raise ValueError(
            f"descriptive_seeds must be None or a whole number >= 0; got {descriptive_seeds!r}."
        )
    if isinstance(eval_seed, bool) or not isinstance(eval_seed, int) or eval_seed < 0:
        raise ValueError(f"eval_seed must be a whole number >= 0; got {eval_seed!r}.")
    described = set(seed_list if descriptive_seeds is None else seed_list[:descriptive_seeds])
    cache = Path(cache_dir)
    setups = {t: tier_setup(t, quick) for t in tiers}
    if variants is not None:
        known = {v for s in setups.values() for v in s["variants"]}
        bad = [v for v in variants if v not in known]
        if bad:
            raise ValueError(
                f"variants: no tier here has a variant {bad[0]!r} (their variants: "
                f"{', '.join(sorted(known))})."
            )
        for t, s in setups.items():
            s["variants"] = tuple(v for v in s["variants"] if v in variants)
            if not s["variants"]:
                raise ValueError(f"variants: none of {list(variants)} is a variant of tier {t}.")
    jobs = [(t, v, s) for t in tiers for v in setups[t]["variants"] for s in seed_list]
    code = _reading_digest()
    models = []
    # float32 models: the study runs with x64 off whatever the caller's mode (the mode
    # changes how Python numbers promote, so the last bits), so that the command line
    # and the figure script compute, and reuse, the same readings
    with jax.enable_x64(False):
        for t, v, s in tqdm(jobs, desc="long-context models", disable=not progress):
            models.append(
                _train_and_read(
                    t,
                    setups[t],
                    v,
                    s,
                    cache,
                    retrain=retrain,
                    progress=progress,
                    scaled=s in described,
                    dynamics=s in described,
                    code=code,
                    eval_seed=eval_seed,
                )
            )
        versions = run_metadata()
    data: dict[str, Any] = dict(
        settings=dict(
            quick=bool(quick),
            seeds=seed_list,
            tiers=list(tiers),
            descriptive_seeds=sorted(described),
            eval_seed=eval_seed,
            rule=RULE,
            **{
                f"tier_{t}": dict(
                    variants=list(s["variants"]),
                    train_length=s["train_length"],
                    lengths=s["lengths"],
                    sequences=s["sequences"],
                    baseline=BASELINE[t],
                )
                for t, s in setups.items()
            },
            versions=versions,
        ),
        models=models,
        tiers={t: summarise([e for e in models if e["tier"] == t], setups[t], t) for t in tiers},
    )
    result = LongContextResult(json.loads(json.dumps(data, allow_nan=False)))
    if out is not None:
        result.save(Path(out) / filename)
    return result


def _seed_list(seeds: int | Sequence[int]) -> list[int]:
    if isinstance(seeds, bool):
        raise ValueError(f"seeds must be a count >= 1 or a list of seeds; got {seeds!r}.")
    if isinstance(seeds, (int, np.integer)):
        if seeds < 1:
            raise ValueError(f"seeds must be a count >= 1 or a list of seeds; got {seeds!r}.")
        return list(range(int(seeds)))
    out = list(seeds)
    if (
        not out
        or any(isinstance(x, bool) or not isinstance(x, (int, np.integer)) or x < 0 for x in out)
        or len(set(out)) != len(out)
    ):
        raise ValueError(
            f"seeds must be a count >= 1 or distinct whole numbers >= 0; got {seeds!r}."
        )
    return [int(x) for x in out]
