"""The long-context decoder's trained heads through the dynamics, for
``attnflow.studies.longcontext`` (tier B). The heads themselves, as ``TrainedHead``s and
as attnflow models, are ``attnflow.networks._decoder_heads`` (``decoder_heads``,
``head_model``).

``heads_through_dynamics`` asks of each head:

- ``triple``: the clustering theorems' hypotheses of the unmasked softmax triple
  (``analyze_heads``: lambda_1 of ``V_h`` real, positive, simple, dominant;
  ``<Q phi_1, K phi_1>``; ``sym(Q^T K)``), with the QK-norm gains folded into the maps
  (``diag(wq) Q_h``, ``diag(wk) K_h``: the bilinear form the normalised logits take,
  up to each token's normalisation);
- ``regime``: ``predict_regime`` of the head's own model: every head is causal, so this
  is "unclassified" with the reason naming the mask, the kernel or the gate;
- ``simulation``: the head's flow ``dx_i/dt = F(x)_i`` in the original frame (the
  only frame that serves sinks and gates), as ``layers`` Euler layers (the discrete
  transformer of the head, which unlike the adaptive solver never runs out of steps on
  sharply switching attention) from its own token states (``sequences`` sequences of
  length ``train_length``) up to ``t1 = choose_t1(|lambda_1|, horizon, t1_max)``: the
  statuses, the final rank, the leaders and the Boolean distance (``track_rank``), the
  dispersion of the attention at the start and at each system's last finite save
  (largest coefficient, logit spread, normalised entropy, mass on BOS, row sum, each
  averaged over the rows and the systems; ``None`` when no save is finite) and
  ``observe_limit``'s label or its refusal.

Every value returned is plain JSON (``attnflow.io.serialize.to_jsonable``). The
simulation runs in JAX's working precision: with x64 on (the caller's choice; the
library never turns it on) the horizon is meaningful far into the clustering.
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING, Any

import equinox as eqx
import jax
import numpy as np

from ..io.checkpoints import HeadWeights
from ..io.serialize import to_jsonable
from ..networks._decoder_heads import decoder_heads, head_arrays, head_model
from ..networks._decoder_task import DecoderConfig, sample_batch

if TYPE_CHECKING:
    from ..networks._decoder_model import Decoder

__all__ = ["heads_through_dynamics"]

STATES_SEED = 2_000_003  # added to the config's seed: the sequences whose states are run


def _dispersion(one: Any, xs: list[np.ndarray | None]) -> dict[str, Any] | None:
    """The head's dispersion on each system's tokens (``None``: a system with no finite
    save), each statistic averaged over the query rows, then over the systems."""
    from ..analysis.dispersion import dispersion

    reps = [dispersion(one, x=x) for x in xs if x is not None]
    if not reps:
        return None
    stats = dict(max="max", delta="delta", entropy_normalized="entropy_normalized")
    stats.update(first_mass="sink_mass", row_sum="row_sum")
    return {k: float(np.mean([np.mean(getattr(r, f)) for r in reps])) for k, f in stats.items()}


def _simulate(one: Any, x0: np.ndarray, t1: float, saves: int, layers: int) -> dict[str, Any]:
    from ..analysis.observe import observe_limit
    from ..analysis.rank import track_rank
    from ..dynamics.simulate import simulate

    dt = t1 / layers
    ts = dt * np.round(np.linspace(0, layers, saves))
    traj = simulate(one, x0, t1, ts=ts, frame="original", method="euler", dt=dt)
    rt = track_rank(traj)
    observed, first, last = [], [], []
    for s in range(x0.shape[0]):
        try:
            obs = observe_limit(traj, system=s)
            observed.append(dict(label=str(obs.label), reason=obs.reason))
        except ValueError as exc:  # no propagator (a gate), or what else it refuses
            observed.append(dict(label=None, refused=str(exc)))
        x = np.asarray(traj.x[s])
        fine = [k for k in np.flatnonzero(np.asarray(traj.reached[s])) if np.isfinite(x[k]).all()]
        first.append(x[0])
        last.append(x[fine[-1]] if fine else None)
    return dict(
        t1=t1,
        layers=layers,
        saves=saves,
        frame="original",
        statuses=[str(s) for s in traj.statuses],
        final_rank=np.asarray(rt.final_rank).tolist(),
        n_attended=np.asarray(rt.n_attended)[:, -1].tolist(),
        leaders=[np.asarray(lead).tolist() for lead in rt.leaders],
        leaders_settled=np.asarray(rt.leaders_settled).tolist(),
        # None for a system that stopped before the last save (its status says why)
        boolean_distance=[
            float(v) if np.isfinite(v) else None for v in np.asarray(rt.boolean_distance)[:, -1]
        ],
        dispersion_start=_dispersion(one, first),
        dispersion_end=_dispersion(one, last),
        observed=observed,
    )


def heads_through_dynamics(
    model: Decoder,
    config: DecoderConfig,
    *,
    sequences: int = 2,
    horizon: float = 10.0,
    t1_max: float = 40.0,
    saves: int = 21,
    layers: int = 400,
    rtol: float = 1e-8,
) -> list[dict]:
    """Every trained head of the decoder through the theorems and its own dynamics.

    Args:
        model: a trained ``Decoder``; config: its configuration.
        sequences: validation sequences whose states start the runs (one batch).
        horizon, t1_max: the final time ``choose_t1(|lambda_1|, horizon, t1_max)``.
        saves: saved times in ``[0, t1]``.
        layers: Euler layers of the run (``dt = t1 / layers``; a multiple of
            ``saves - 1`` saves on layers exactly).
        rtol: the tolerance of the theorems' decisions (``predict_regime``).

    Returns:
        One JSON-ready dict per head, layer-major: ``layer``, ``head``, ``variant``,
        ``kernel`` (its name), ``mask`` (``"causal"``), ``gated``, ``logit_bound`` (QK norm:
        ``beta p max|wq| max|wk|``, else None), ``sink_logit``, ``gate`` (the gate's
        weight norm and bias, or None), ``triple`` (the ``HeadReport`` of the folded
        triple), ``regime`` (label, theorem, reason of the head's own model) and
        ``simulation`` (see the module docstring), ``seconds``.

    Example:
        >>> import jax
        >>> from attnflow.networks._decoder import Decoder, DecoderConfig
        >>> from attnflow.studies._decoder_dynamics import heads_through_dynamics
        >>> config = DecoderConfig.quick("qknorm+gate")
        >>> out = heads_through_dynamics(Decoder(config, jax.random.key(0)), config, horizon=2.0)
        >>> len(out), out[0]["regime"]["label"], out[0]["simulation"]["statuses"]
        (4, 'unclassified', ['ok', 'ok'])
    """
    from ..analysis.regimes import predict_regime
    from ..networks._decoder_model import layer_states
    from .heads import analyze_heads, choose_t1

    if isinstance(sequences, bool) or not isinstance(sequences, int) or sequences < 1:
        raise ValueError(f"sequences must be a whole number >= 1; got {sequences!r}.")
    if not (isinstance(horizon, (int, float)) and math.isfinite(horizon) and horizon > 0):
        raise ValueError(f"horizon must be a finite number > 0; got {horizon!r}.")
    if isinstance(saves, bool) or not isinstance(saves, int) or saves < 2:
        raise ValueError(f"saves must be a whole number >= 2; got {saves!r}.")
    if isinstance(layers, bool) or not isinstance(layers, int) or layers < saves - 1:
        raise ValueError(f"layers must be a whole number >= saves - 1; got {layers!r}.")
    heads = decoder_heads(model, config)
    folded = [
        HeadWeights(
            layer=t.layer,
            head=t.head,
            Q=t.Q if t.q_norm is None else t.q_norm[:, None] * t.Q,
            K=t.K if t.k_norm is None else t.k_norm[:, None] * t.K,
            V=t.V,
            beta=t.beta,
            W_O_h=t.W_O_h,
            W_V_h=t.W_V_h,
            source=t.source,
        )
        for t in heads
    ]
    reports = analyze_heads(folded, rtol=rtol).heads
    batch = sample_batch(
        jax.random.key(config.seed + STATES_SEED), config, sequences, config.train_length
    )
    dt = jax.dtypes.canonicalize_dtype(np.float64)
    with jax.numpy_dtype_promotion("standard"):
        run = eqx.filter_jit(jax.vmap(layer_states, in_axes=(None, 0)))
        states = [np.asarray(u, dt) for u in run(model, batch.tokens)]
    out = []
    for t, rep in zip(heads, reports):
        start = time.perf_counter()
        one = head_model(model, config, t.layer, t.head)
        regime = predict_regime(one, rtol=rtol)
        a = head_arrays(model, t.layer, t.head)
        t1 = choose_t1(rep.lambda1_abs, horizon=horizon, t1_max=t1_max)
        sim = _simulate(one, states[t.layer], t1, saves, layers)
        bound = None if a["wq"] is None else float(t.logit_bound() or 0.0)
        out.append(
            to_jsonable(
                dict(
                    layer=t.layer,
                    head=t.head,
                    variant=config.variant,
                    kernel=one.head().kernel.name,
                    mask="causal",
                    gated=a["Wg"] is not None,
                    logit_bound=bound,
                    sink_logit=a["b"],
                    gate=None
                    if a["Wg"] is None
                    else dict(weight_norm=float(np.linalg.norm(a["Wg"])), bias=a["bg"]),
                    triple=rep.to_dict(),
                    regime=dict(
                        label=str(regime.label), theorem=regime.theorem, reason=regime.reason
                    ),
                    simulation=sim,
                    seconds=time.perf_counter() - start,
                )
            )
        )
    return out
