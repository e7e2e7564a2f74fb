"""The engine the padded communicator was written for (no version: its source is not in this repository).

Its rules, as the fix found them and docs/design.md section 2 states them:

- Strategies: ``round_robin`` (token ``t`` on rank ``t % cp``), ``zigzag``
  (``2*cp`` blocks per request, rank ``k`` owns blocks ``k`` and ``2*cp-1-k``)
  and, with a shared KV pool, ``zigzag_page`` (the same on page boundaries).
- The batch is padded to a multiple of ``align`` (default ``cp``) before the
  split by lengthening the last request: the alignment tokens are split as if
  they were real.
- Every batch runs with CP (no refusal).
- The MoE all-gather path moves uneven shards with the padded communicator
  (``m = max_r n_r`` rows per rank inside the gather); the split-time padding
  modelled beside it pads every rank to ``ceil_align(m, 2*cp)`` for the zigzag
  strategies and ``ceil_align(m, cp)`` otherwise, and attention and the MoE
  compute the padding rows (nothing is masked).

``zigzag_page`` at cp 2, pages of 2, one request of 9 tokens ``A..I``::

    batch, aligned to cp:  A B C D E F G H I x          x: the alignment token, split as real
    blocks on pages:       | A B C D | E F | G H | I x |
    rank 0: blocks 0, 3:   A B C D I x                  n_0 = 6
    rank 1: blocks 1, 2:   E F G H                      n_1 = 4
    gathered [m*cp, H]:    [A B C D I x | E F G H 0 0]  m = max n_r = 6, zero rows after n_1
    at the split:          P = ceil_align(6, 2*cp) = 8 rows a rank, the padding computed too
"""

from __future__ import annotations

from typing import Any

ZIGZAG = ("zigzag", "zigzag_page")


def split_align(policy: str, cp: int) -> int:
    return 2 * cp if policy in ZIGZAG else cp


def refuses(min_len: Any, total: Any, cp: int, policy: str) -> Any:
    return min_len < 0  # never: every batch is split (False, or an all-False array)


def refusal_reason(min_len: int, total: int, cp: int, policy: str) -> str:
    return ""


TITLE = "the seed fix's engine"
SOURCE = "docs/design.md section 2 (the engine the padded communicator was written for)"
STRATEGIES = ("round_robin", "zigzag", "zigzag_page")
PADS_BATCH = True
ATTN_PAD_MASKED = False
MOE_PAD_MASKED = False
