"""The result of ``attnflow.studies.layerwise.run_layerwise``, pooled over the corpus.

Contract. ``LayerwiseResult`` holds the run's configuration, its metadata and one record
per finished sentence (the arrays ``run_layerwise`` writes). ``histograms()`` adds the
cosine counts over sentences (and, for the single-head predictions, over the heads of a
layer) and divides by the total and the bin width: densities on ``[-1, 1]``.
``summary()`` gives plain-JSON numbers per layer: means over sentences (and heads) of
each statistic, with the standard deviation over sentences where it is quoted. A token
of a sentence is "special" at position 0 ([CLS]) or ``n - 1`` ([SEP]).
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any

import numpy as np

__all__ = ["LayerwiseResult"]

BOOLEAN_TOL = 1e-6  # a final attention matrix this close to a Boolean one counts as one


def _mean(values: Any) -> float:
    return float(np.mean(np.asarray(values, np.float64)))


@dataclasses.dataclass(frozen=True, eq=False)
class LayerwiseResult:
    """A layerwise run (``load_layerwise``).

    Attributes:
        config: what determined the numbers (checkpoint, sentences, simulated sentence
            indices, solver settings, bins).
        info: versions and precision of the run that created the store.
        records: one dict of arrays per finished sentence (keys in
            ``attnflow.studies.layerwise``: ``histogram`` ``(L + 1, bins)``,
            ``mean_cosine``, ``clusters``, ``effective_rank`` ``(L + 1,)``,
            ``attn_boolean_distance``, ``attn_attended`` ``(L, h)``, ``attn_mass`` ``(L, h,
            n)``, ``block_error`` ``(L,)``, and for simulated sentences ``head_x_*``,
            ``head_z_*``, ``head_mass`` ``(L, h, n)``, ``head_status``, ...).
    """

    config: dict
    info: dict
    records: list

    @property
    def num_layers(self) -> int:
        return int(self.records[0]["attn_boolean_distance"].shape[0]) if self.records else 0

    @property
    def num_heads(self) -> int:
        return int(self.records[0]["attn_boolean_distance"].shape[1]) if self.records else 0

    def simulated(self) -> list[dict]:
        """The records whose heads were simulated."""
        return [r for r in self.records if bool(r["simulated"])]

    def histograms(self) -> dict[str, np.ndarray]:
        """Pooled cosine densities: ``measured`` ``(L + 1, bins)`` over every sentence,
        ``measured_simulated`` over the simulated ones, ``head_x`` and ``head_z`` ``(L,
        bins)`` (row ``l``: the heads of layer ``l`` at ``t1``, all heads and simulated
        sentences together), and ``edges`` ``(bins + 1,)``."""
        bins = int(self.config["bins"])
        edges = np.linspace(-1.0, 1.0, bins + 1)
        width = 2.0 / bins

        def density(counts: Any) -> np.ndarray:
            counts = np.asarray(counts, np.float64)
            tot = counts.sum(axis=-1, keepdims=True)
            return np.where(tot > 0, counts / np.maximum(tot, 1) / width, 0.0)

        out = {"edges": edges}
        if not self.records:
            return out
        out["measured"] = density(sum(r["histogram"] for r in self.records))
        sim = self.simulated()
        if sim:
            out["measured_simulated"] = density(sum(r["histogram"] for r in sim))
            for f in ("x", "z"):
                out[f"head_{f}"] = density(sum(r[f"head_{f}_histogram"].sum(axis=1) for r in sim))
        return out

    def summary(self) -> dict[str, Any]:
        """Per-layer numbers (module docstring), plain JSON."""
        recs = self.records
        if not recs:
            return {"sentences": 0}
        L = self.num_layers
        n = np.array([r["ids"].size for r in recs], np.float64)

        def measured(rs: list[dict]) -> dict[str, Any]:
            nn = np.array([r["ids"].size for r in rs], np.float64)[:, None]
            mc = np.stack([r["mean_cosine"] for r in rs])
            cl = np.stack([r["clusters"] for r in rs])
            er = np.stack([r["effective_rank"] for r in rs])
            return {
                "mean_cosine": mc.mean(0).tolist(),
                "mean_cosine_sd": mc.std(0).tolist(),
                "clusters_per_token": (cl / nn).mean(0).tolist(),
                "no_two_tokens_joined_fraction": (cl == nn).mean(0).tolist(),
                "effective_rank": er.mean(0).tolist(),
                "effective_rank_per_token": (er / nn).mean(0).tolist(),
            }

        out: dict[str, Any] = {
            "sentences": len(recs),
            "tokens": {"mean": float(n.mean()), "min": int(n.min()), "max": int(n.max())},
            "num_layers": L,
            "num_heads": self.num_heads,
            "measured": measured(recs),
        }
        bd = np.stack([r["attn_boolean_distance"] for r in recs])  # (S, L, h)
        att = np.stack([r["attn_attended"] / r["ids"].size for r in recs])
        special = np.stack(
            [(r["attn_mass"][..., 0] + r["attn_mass"][..., -1]) / r["ids"].size for r in recs]
        )
        out["attention"] = {
            "boolean_distance_median": np.median(bd, axis=(0, 2)).tolist(),
            "boolean_distance_per_head_mean": bd.mean(0).tolist(),
            "boolean_below_1e-2_fraction": (bd < 1e-2).mean(axis=(0, 2)).tolist(),
            "attended_per_token": att.mean(axis=(0, 2)).tolist(),
            "mass_on_cls_sep": special.mean(axis=(0, 2)).tolist(),
            "mass_on_cls_sep_per_head": special.mean(0).tolist(),
        }
        be = np.stack([r["block_error"] for r in recs])
        out["block"] = {
            "relative_error_max": be.max(0).tolist(),
            "mean_cosine": np.stack([r["block_mean_cosine"] for r in recs]).mean(0).tolist(),
        }
        sim = self.simulated()
        if not sim:
            return out
        out["measured_simulated"] = measured(sim)
        heads: dict[str, Any] = {"sentences": len(sim)}
        nn = np.array([r["ids"].size for r in sim], np.float64)[:, None, None]
        for f in ("x", "z"):
            mc = np.stack([r[f"head_{f}_mean_cosine"] for r in sim])  # (S, L, h)
            cl = np.stack([r[f"head_{f}_clusters"] for r in sim])
            er = np.stack([r[f"head_{f}_effective_rank"] for r in sim])
            heads[f] = {
                "mean_cosine": mc.mean(axis=(0, 2)).tolist(),
                "mean_cosine_per_head": mc.mean(0).tolist(),
                "clusters_per_token": (cl / nn).mean(axis=(0, 2)).tolist(),
                "one_cluster_fraction": (cl == 1).mean(axis=(0, 2)).tolist(),
                "at_most_two_clusters_fraction": (cl <= 2).mean(axis=(0, 2)).tolist(),
                "effective_rank": er.mean(axis=(0, 2)).tolist(),
                "effective_rank_per_token": (er / nn).mean(axis=(0, 2)).tolist(),
            }
        hb = np.stack([r["head_boolean_distance"] for r in sim])
        lead = np.stack([[[int(np.argmax(m)) for m in row] for row in r["head_mass"]] for r in sim])
        last = np.array([r["ids"].size - 1 for r in sim])[:, None, None]
        heads["boolean_fraction"] = (hb <= BOOLEAN_TOL).mean(axis=(0, 2)).tolist()
        heads["attended_per_token"] = (
            (np.stack([r["head_attended"] for r in sim]) / nn).mean(axis=(0, 2)).tolist()
        )
        heads["top_leader_cls_sep_fraction"] = (
            ((lead == 0) | (lead == last)).mean(axis=(0, 2)).tolist()
        )
        heads["statuses"] = dict(
            collections.Counter(str(s) for r in sim for s in r["head_status"].ravel())
        )
        heads["methods"] = dict(
            collections.Counter(str(m).split(" ")[0] for r in sim for m in r["head_method"].ravel())
        )
        heads["num_steps_median"] = float(np.median([r["head_num_steps"] for r in sim]))
        heads["boolean_tol"] = BOOLEAN_TOL
        out["heads"] = heads
        return out
