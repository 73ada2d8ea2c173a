"""Seeds of the random streams (a leaf module: no torch, so the analysis can use it)."""

from __future__ import annotations

import hashlib


def derive_seed(seed: int, *tags: int | str) -> int:
    """A stable 31-bit seed for one random stream (e.g. ``derive_seed(seed, "gen", step)``).

    Each phase reseeds from its own stream, so streams never interfere (the on-policy buffer
    can't shift generation) and a resumed run replays exactly the same randomness."""
    blob = ":".join(str(x) for x in (seed, *tags)).encode()
    return int.from_bytes(hashlib.blake2b(blob, digest_size=8).digest(), "little") % (2**31 - 1)
