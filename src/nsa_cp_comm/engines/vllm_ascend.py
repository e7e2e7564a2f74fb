"""vllm-ascend's DSA-CP (sparse-attention context parallelism on the TP group), read from
``vllm_ascend/attention/context_parallel/dsa_cp.py`` (vllm-project/vllm-ascend at commit
0034d57f; ``sfa_cp.py`` shares the split).

The split (``AscendDSACPMetadataBuilder._build_local_token_metadata``), TP 3,
nine requests of 1..9 tokens, 45 tokens in all::

    stream:  | 0 ........ 14 | 15 ........ 29 | 30 ........ 44 |
    rank:    |      0        |       1        |       2        |
    requests 5, 6 and 7 (tokens 15-29) on rank 1; request 7 cut across ranks 1 and 2

- Strategy: ``contiguous`` only. The flattened token stream padded to
  ``num_tokens_pad = ceil_align(T, tp)``, one contiguous slice of
  ``tokens_per_rank = num_tokens_pad / tp`` tokens per rank
  (``local_start = tp_rank * tokens_per_rank``). A request can be cut across
  ranks (``local_query_start`` / ``local_query_end`` clamp each request's
  interval to the rank's); only the tail rank(s) hold padding, and a batch of
  fewer tokens than tp leaves tail ranks with no real rows.
- No batch padding before the split: the padding is the split's (rows past
  ``T`` on the tail ranks), so ``P = tokens_per_rank = max n_r`` (no
  alignment beyond the slice).
- What runs on the padding: attention sees only the real rows
  (``local_query_lens``, ``local_seq_lens`` are clamped to ``T``): masked. The
  MoE gets the equal all-gather of the padded slices (``all_gather_async`` of
  ``[tokens_per_rank, H]`` per rank), then a slice back: no padding mask:
  processed.
- Refusals: DSA-CP is a TP-group split; with one rank there is nothing to split
  (the batch runs without CP).
"""

from __future__ import annotations

from ._rules import only_one_rank, unaligned

STRATEGY_NAMES = {"contiguous": "DSA-CP contiguous slices"}
PADDING_AT = "the tail rank(s) of the stream"


# P = max n_r; only pcp = 1 runs without CP
split_align, refuses = unaligned, only_one_rank


def refusal_reason(min_len: int, total: int, cp: int, policy: str) -> str:
    return "DSA-CP needs a TP group of more than one rank: the batch runs without CP"


TITLE = "vllm-ascend DSA-CP"
SOURCE = "vllm-ascend: vllm_ascend/attention/context_parallel/dsa_cp.py (_build_local_token_metadata), sfa_cp.py"
STRATEGIES = ("contiguous",)
PADS_BATCH = False
ATTN_PAD_MASKED = True
MOE_PAD_MASKED = False
