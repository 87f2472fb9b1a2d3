"""Parsing of the command line's list arguments: ``parse_dims`` reads ``--d`` (ginibre)
and ``--n`` (dispersion) lists such as ``"2,4,8,...,256"``. Pure Python: no JAX, no
numpy; every error is a ``ValueError`` naming the option and what to write."""

from __future__ import annotations

__all__ = ["parse_dims"]


def parse_dims(text: str) -> list[int]:
    """Parse a list of dimensions: ``"2,4,8"``, or with ``...`` continuing a progression
    given by at least three terms, ``"2,4,8,...,256"`` (geometric) or ``"8,16,24,...,64"``
    (arithmetic); the last term must lie on the progression."""
    items = [t.strip() for t in str(text).split(",") if t.strip()]
    if not items:
        raise ValueError(f"--d must list dimensions like '2,4,8' or '2,4,8,...,256'; got {text!r}.")
    out: list[int] = []
    k = 0
    while k < len(items):
        t = items[k]
        if t == "...":
            if len(out) < 3 or k + 1 >= len(items) or items[k + 1] == "...":
                raise ValueError(
                    f"--d: '...' needs three terms before it and a last term "
                    f"after it, e.g. '2,4,8,...,256'; got {text!r}."
                )
            a, b, c = out[-3:]
            end = _dim(items[k + 1], text)
            if b - a == c - b and c > b:
                step = c - b
                if (end - c) % step or end <= c:
                    raise ValueError(f"--d: {end} is not on the progression {a},{b},{c},...")
                out.extend(range(c + step, end + 1, step))
            elif a > 0 and b * b == a * c and c > b and b % a == 0:
                r = b // a
                x = c
                while x < end:
                    x *= r
                    out.append(x)
                if out[-1] != end:
                    raise ValueError(f"--d: {end} is not on the progression {a},{b},{c},...")
            else:
                raise ValueError(
                    f"--d: {a},{b},{c} is neither an increasing arithmetic nor "
                    f"an integer geometric progression; list the dimensions."
                )
            k += 2
            continue
        out.append(_dim(t, text))
        k += 1
    return out


def _dim(t: str, text: str) -> int:
    try:
        v = int(t)
    except ValueError:
        raise ValueError(
            f"--d: {t!r} is not an integer (in {text!r}); write e.g. '2,4,8,...,256'."
        ) from None
    if v < 1:
        raise ValueError(f"--d: dimensions must be >= 1; got {v}.")
    return v
