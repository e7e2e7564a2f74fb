"""What a matrix point checks on every rank, before anything is timed.

Each check has a name (the ``failed_check`` column) and can fail; tests break
the thing checked and see it fail (tests/lib/test_checks.py, tests/app/test_plugins.py).
:data:`CHECKS` says what each one proves, in the order they run; the table
in docs/design.md is rendered from it (docs/doc_tables.py).
Light checks (``run_point(..., checks="light")``, FULL mode) leave out
``reference_moe`` and ``even_bitwise``, for production shapes where the
reference MoE does not fit (:func:`check_light`). ``production_form``, every
timed iteration's outputs, is checked during the timed loop (:mod:`.verify`).

Checks run on the correctness group: a process group created with torch's
collective-consistency checking (TORCH_DISTRIBUTED_DEBUG=DETAIL's wrapper),
so a rank issuing a different collective than its peers is an error there,
not a hang or an abort. The timed loop uses the plain group.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from .. import engines, quant
from .. import impls as impl_registry
from ..collectives import Observed, observing
from ..communicator import CPLayerCommunicator
from ..hooks import ask
from .cpgroup import cp_group, cp_ranks
from ..modes import ScatterMode
from ..moe import ReferenceMoE, counted_cp_times, max_rel_err, tolerance
from ..plan import CPPlan
from ..protocol import DispatchImpl, RoundTripImpl, add_replicated, shard_len
from ..roundtrip import LEGACY_UNEVEN_ERROR, legacy_gather, legacy_scatter
from .spec import DTYPES, PointSpec, as_bytes, bitwise_equal, make_shard, padding_content


# Every name a row's ``failed_check`` can hold, and what passing it proves
# (with the mistake it catches), in the order they run. FULL mode: from
# ``input_mutated`` to ``group``, then ``production_form`` during the timed loop.
# SCATTERED mode: ``passthrough`` for the CP communicator; an a2a implementation
# gets ``input_mutated``, ``dispatch_rows`` and ``reference_moe``. The last
# four are found over ranks (:mod:`.fold`, :mod:`.measure`; ``rank_state``
# after the point, :mod:`.rank_state`), not here.
CHECKS: dict[str, str] = {
    "input_mutated": "the gather (or dispatch) left the caller's rows untouched",
    "gather_shape": "the gathered buffer has the layout's size (when it has not, the checks that read it are not run "
                    "and the reason names them: nothing is judged on a stand-in)",
    "gather_rows": "every rank's rows are in the gathered buffer byte-exact at the layout's offsets (a wrong rank "
                   "order or offset, a lost row fails)",
    "physical_len": "an implementation that pads at the split (`pads_split`) gives every rank the physical length "
                    "of the point's engine's rule (`engine`: `P = ceil_align(max n_r, 2*cp` for zigzag splits, `cp` "
                    "otherwise`)`, on the engine's own split): a `P` wrong everywhere (gather, declared stride, "
                    "production form) is consistent with itself and fails only here",
    "padding_zero": "every padding row of the padded layout is zero (the reduce-scatter sums padding rows too); "
                    "with `shard = \"padded\"`, the padding rows hold what the point's engine puts there (vLLM: "
                    "one non-zero row, token id 0's, in every slot; SGLang: zeros) and the gathered buffer carries "
                    "them as the shard held them, and the `[P, H]` output's rows `n_r..P` are what the engine's "
                    "experts make of them, summed over the ranks: nothing routed where the model's router masks "
                    "them (vLLM's DeepSeek-V4), the routed experts' output where it routes them (DeepSeek-V3.2): a "
                    "copy that masks where the model routes fails here, naming the rows (garbage there is the "
                    "implementation's)",
    "scatter_chunk": "with rank 0 contributing the gathered buffer and every other rank zeros, the scatter returns "
                     "this rank's own rows byte-exact (a wrong chunk, a wrong slice, a lost row; the reason names a "
                     "wrong dtype, shape or device, and where in the gathered buffer the returned rows are: rows at "
                     "the wrong offset)",
    "side_tensors": "where the point's engine gathers a side tensor beside the rows (vLLM: the router logits, "
                    "`[rows, experts]`, fp32 for GLM-5 and DeepSeek-V4; vLLM 0.34 on a monolithic block-fp8 kernel, "
                    "`moe_quant=fp8_block_monolithic`: the fp8 rows and their scales first), the implementation's "
                    "`gather_side` (its `gather` where it has none) returned it in the hidden states' layout, every "
                    "rank's part where its rows are; the MoE then routes from the logits and computes on the "
                    "dequantized rows that came back, as the engine's kernels do (a tensor gathered in another "
                    "layout, or not at all, is named)",
    "padding_routing": "where the point's model's router masks the padding rows it is told of (vLLM's "
                       "DeepSeek-V4: `is_padding`, `pcp_manager.py:630-635`), the implementation's `is_padding` "
                       "(when it has one) marks exactly the gathered buffer's padding rows: a padding row left "
                       "unmarked is routed, and identical padding rows all go to the same experts (the reason names "
                       "how many and the most one expert got: one expert's load and its statistics skewed); a real "
                       "row marked goes to no expert. The MoE masks what it was told",
    "reference_moe": "the round trip through a small MoE (every rank's experts on all gathered rows, "
                     "reduce-scattered, and the shared expert as `shared_expert` places it: `sharded`, each rank's "
                     "share in its partials; `replicated`, computed whole on every rank and handed to the "
                     "implementation to add once after the reduce-scatter) matches a single-process reference "
                     "(every expert and the shared one on the unsplit rows) within the dtype's tolerance "
                     "(`max_rel_err`); an output that is the reference plus `cp - 1` times the shared expert's "
                     "output on the rank's rows is named: a replicated term counted cp times (added before the "
                     "reduce-scatter, which sums it over the ranks)",
    "even_bitwise": "on an even plan, the gathered buffer and the MoE round trip's output equal legacy's bit for bit, "
                    "legacy recomputed on the same inputs (`even_bitwise_equal`; implementations with "
                    "`legacy_bits_on_even`, on the even plans its rule names: `pad_at_split` where `P*cp == T`)",
    "refusal": "an even-only implementation given an uneven plan raised in gather and in scatter on every rank with "
               "no collective issued, whatever path would issue it (`distributed_c10d`, a group's methods, the "
               "functional or object collectives: the CP group's and the default group's sequence numbers unchanged, "
               "the ranks' own input agreement left out), and legacy with torch's text",
    "group": "the gather and the scatter issued no collective on the default group (its sequence number; with "
             "`bystanders`, such a collective cannot complete: an `error` or `timeout` row), and the scatter did "
             "not pick this rank's rows with the global rank (`dist.get_rank()`) where `dist.get_rank(group)` is "
             "meant: a wrong output that equals the rows, or the row count, of the rank whose group rank is this "
             "process's global rank, on every rank where that differs from its own (a slot that fits on some ranks "
             "only is a wrong offset: `scatter_chunk`); with `bystanders`, an index out of range only on the ranks "
             "whose global rank is past the CP group's ranks (an `error` row)",
    "passthrough": "in SCATTERED mode the CP communicator hands the MoE its own rows untouched",
    "dispatch_rows": "a dispatch delivered exactly the rows routed to this rank's experts",
    "production_form": "every iteration of the timed loop (warm-up included), on inputs no earlier iteration had "
                       "(each rank's rows XORed with a per-iteration mask, the partials a per-iteration pattern whose "
                       "sums are exact), returned the gathered buffer with every rank's rows of that iteration "
                       "byte-exact at the layout's offsets and zero padding, and the scatter output equal byte for "
                       "byte to the ranks' partials summed (with `shard = \"padded\"`: `[P, H]`, the sums then zero "
                       "rows), and left the caller's rows as given: checked untimed "
                       "right after each phase against a reference drawn from the seed, not from what the form was "
                       "given (a cache, a stale shared buffer, a form right only some of the time or that writes into "
                       "its input fails); the reason counts the wrong iterations. A dispatch implementation's "
                       "iterations alike: new rows and routing metadata each iteration, the received rows, expert "
                       "ids and weights exactly those routed here, the combine's output the exact sum of what the "
                       "ranks each token went to handed back",
    "rank_agreement": "every rank reached the same outcome: none refused or passed through while others ran",
    "collective_skipped": "every rank entered the same collectives (from the pool: some ranks returned while others "
                          "waited in a collective; the correctness group found ranks in different collectives; a "
                          "timed-out point's ranks waited in different collectives, or in different places of the "
                          "point): the row names both, instead of a hang. The mistake: a branch on a local shape, "
                          "e.g. no gather on a rank without rows",
    "collective_shapes": "ranks in the same collective passed the same shapes, dtypes and devices (from the "
                         "correctness group): the row names each rank's, and what happens without the check (gloo: "
                         "'invalid tensor size' on some ranks while the others wait, or SIGABRT; NCCL: torch's size "
                         "error on some ranks while the others hang)",
    "rank_state": "every rank is as it started after each of the implementation's steps (its checks, its timed "
                  "form's building, each of its timed turns) and after the point (asked by the pool): its "
                  "process group alive, torch's intra- and inter-op threads, grad mode, deterministic algorithms "
                  "(and warn-only), flush-denormal, default dtype and device, float32 matmul precision, CUDA matmul "
                  "TF32 and reduced-precision switches, cuDNN and mkldnn switches and the open-file limit unchanged, "
                  "every torch.distributed function the harness calls, the clocks (`time`'s and the harness's own, "
                  "bound at import) and every function, class and method of this library (as each of its "
                  "modules holds it, and the registry's built-ins) the same object; the reason names each change "
                  "with its old and new "
                  "value and the ranks, the implementation after whose step it was found gets the row, and the "
                  "others are rerun on fresh ranks. The mistake: a global left set, or a collective wrapped, that "
                  "would change the next point's rows",
}

@dataclass
class ImplReport:
    """One rank's findings for one implementation at one point."""

    status: str = ""  # "", "refused", "passthrough" or "skipped"
    correct: bool | None = None
    max_rel_err: float | None = None
    even_bitwise_equal: bool | None = None
    reason: str = ""
    failures: list[tuple[str, str]] = field(default_factory=list)  # (check, message)
    samples: dict[str, list[float]] = field(default_factory=dict)
    rows_sent: int | None = None  # dispatch implementations: rows this rank sent
    # a round trip's rows per rank's block of the gathered buffer, as this rank's checks asked it
    stride: int | None = None
    # padding rows of the gathered buffer the engine's router masked, and the most of the routed ones
    # one expert got (FULL mode, a padded layout)
    pad_rows_masked: int | None = None
    pad_expert_max: int | None = None

    def fail(self, check: str, message: str) -> None:
        self.failures.append((check, message))


def checked_group(timeout_s: float, bystanders: int = 0) -> dist.ProcessGroup | None:
    """The CP group the checks run on: :func:`.cpgroup.cp_group` of the world's ranks after
    ``bystanders`` (in reverse order), ``checked``. Created once per process."""
    return cp_group(dist.get_world_size() - bystanders, bystanders=bystanders, checked=True, timeout_s=timeout_s)


def _dtype(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


def unlike(got: object, want: torch.Tensor) -> str:
    """How ``got`` differs from ``want`` other than in its values (not a
    tensor; its dtype, shape, device), '' when only values can differ: the
    part of a failure's reason that names the mistake."""
    if not isinstance(got, torch.Tensor):
        return f"returned {type(got).__name__}, not a tensor"
    diffs = []
    if got.dtype != want.dtype:
        diffs.append(f"dtype {_dtype(got)}, not {_dtype(want)}")
    if tuple(got.shape) != tuple(want.shape):
        diffs.append(f"shape {tuple(got.shape)}, not {tuple(want.shape)}")
    if got.device != want.device:
        diffs.append(f"device {got.device}, not {want.device}")
    return ", ".join(diffs)


def stand_in(shape: tuple[int, ...], dtype: torch.dtype, device) -> torch.Tensor:
    """What :func:`unlike` compares with: a shape, dtype and device, one element of storage."""
    return torch.empty_strided(shape, (0,) * len(shape), dtype=dtype, device=device)


def shard_input(impl: RoundTripImpl, plan: CPPlan, rows: torch.Tensor,
                spec: PointSpec | None = None) -> torch.Tensor:
    """What ``gather`` takes on this rank: a copy of its ``[n_r, H]`` rows, or
    for ``shard = "padded"`` the split's ``[P, H]`` shard, the rows then what
    the engine puts in its padding rows (:func:`.spec.padding_content`:
    SGLang's ``pad_local_rows`` zeros, vLLM's token-0 rows; zeros without
    ``spec``)."""
    if impl.shard != "padded":
        return rows.clone()
    p = shard_len(plan)
    out = rows.new_zeros((p, rows.shape[1]))
    out[: rows.shape[0]].copy_(rows)
    if spec is not None and p > rows.shape[0]:
        out[rows.shape[0]:] = padding_content(spec, plan, p - rows.shape[0], rows.device)
    return out


def padding_mask(impl: RoundTripImpl, plan: CPPlan, device) -> torch.Tensor | None:
    """Which rows of the gathered buffer are padding (bool per row, on
    ``device``), or None for a layout without padding rows."""
    if impl.layout != "rank_major_padded":
        return None
    # rank r's block: its rows 0..n_r-1, then padding
    return (torch.arange(impl.stride(plan), device=device)
            >= torch.tensor(plan.per_rank_tokens, device=device)[:, None]).flatten()


def dirty_tail(t: object, n: int) -> int | None:
    """The first nonzero row of ``t`` at or after row ``n`` (a padded shard's
    padding), or None when they are all zero (or ``t`` is no 2-d tensor)."""
    if not isinstance(t, torch.Tensor) or t.dim() != 2:
        return None
    bad = t[n:].ne(0).any(dim=1).nonzero().flatten()
    return n + int(bad[0]) if bad.numel() else None


def layout_faults(impl: RoundTripImpl, plan: CPPlan, full: torch.Tensor,
                  holds: Callable[[int, torch.Tensor], bool],
                  padding: torch.Tensor | None = None) -> Iterator[tuple[str, int, int]]:
    """A gathered buffer of the layout's size against the layout:
    ``("gather_rows", r, row)`` for each rank ``r`` whose rows at its offset
    ``row`` fail ``holds(r, rows)``, then ``("padding_zero", r, row)`` for
    each rank whose padding rows (from ``row``) are not zero, or not the
    rows of ``padding`` (what the engine put in a padded shard's padding
    rows, one row per slot). The checked gather and every timed iteration
    (:mod:`.verify`) walk it alike."""
    starts = impl.starts(plan)
    for r in range(plan.cp_size):
        n, s = plan.per_rank_tokens[r], starts[r]
        if not holds(r, full[s : s + n]):
            yield "gather_rows", r, s
    if impl.layout == "rank_major_padded":
        m = impl.stride(plan)
        for r in range(plan.cp_size):
            pad = full[r * m + plan.per_rank_tokens[r] : (r + 1) * m]
            if not pad.numel():
                continue
            if (bool(pad.ne(0).any()) if padding is None
                    else not bitwise_equal(pad, padding[: pad.shape[0]].to(pad.device))):
                yield "padding_zero", r, r * m + plan.per_rank_tokens[r]


def check_gather(impl: RoundTripImpl, full: object, spec: PointSpec, plan: CPPlan, device,
                 rep: ImplReport, shards: list[torch.Tensor] | None = None) -> bool:
    """Gathered buffer: size, every rank's rows at its offset, zero padding.
    ``shards``: every rank's rows (generated here when not given). Returns
    whether the buffer is usable for the later checks."""
    if shards is None:
        shards = [make_shard(spec, plan, r, device) for r in range(plan.cp_size)]
    diff = unlike(full, stand_in((impl.buffer_rows(plan), spec.hidden_size), shards[0].dtype, shards[0].device))
    if diff:
        rep.fail("gather_shape", f"gathered buffer: {diff}")
        return False
    if impl.pads_split and impl.layout == "rank_major_padded":
        rule = engines.of(plan)
        want_p = rule.physical_len(plan)
        if impl.stride(plan) != want_p:
            align = rule.split_align(plan.policy, plan.cp_size)
            how = (f"ceil_align(max n_r = {plan.max_rank_len}, {align})"
                   if want_p == rule.split_len(plan.max_rank_len, plan.policy, plan.cp_size)
                   else f"the CUDA-graph capture size that holds max n_r = {plan.max_rank_len} "
                        f"(max_capture_size={plan.max_capture_size})")
            rep.fail("physical_len", f"every rank padded to {impl.stride(plan)} rows at the split; {rule.title}'s rule "
                     f"gives P = {how} = {want_p}")
    # The rows an engine's padded shard holds in its padding slots (enough for any rank), which the
    # gathered buffer moves as they are; None where they are zeros (a shard of rows, or zero padding).
    content = (padding_content(spec, plan, impl.stride(plan), device)
               if impl.shard == "padded" and engines.of(plan).padding_rows != "zeros" else None)
    for check, r, s in layout_faults(impl, plan, full, lambda r, rows: bitwise_equal(rows, shards[r]), content):
        rep.fail(check, f"gathered rows of rank {r} (at row {s}) differ from rank {r}'s shard" if check == "gather_rows"
                 else f"padding rows of rank {r} are not zero" if content is None
                 else f"padding rows of rank {r} (from row {s}) are not the ones its shard held (the engine's "
                      f"padding: {engines.of(plan).padding_rows})")
    return True


def _compare_to_reference(rep: ImplReport, out: object, local: torch.Tensor, moe: ReferenceMoE, spec: PointSpec,
                          plan: CPPlan, what: str) -> None:
    ref = moe.reference(local)
    diff = unlike(out, local)  # the reference is float32; the output has the rows' dtype
    ok_shape = isinstance(out, torch.Tensor) and out.shape == ref.shape
    rep.max_rel_err = max_rel_err(out, ref) if ok_shape else math.inf
    tol = tolerance(DTYPES[spec.dtype], plan.cp_size)
    if not rep.max_rel_err <= tol:
        rep.fail("reference_moe", f"{what} vs reference MoE: max_rel_err {rep.max_rel_err:.3g} > {tol:.3g}"
                 + (f" ({diff})" if diff else "") + (_overcount(out, ref, moe, local, plan.cp_size, tol)
                                                      if ok_shape else ""))


def _side_tensors(moe: ReferenceMoE, rule: engines.Engine, rows: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
    """What the point's engine gathers beside the rows, as each rank makes it from its rows
    ``rows``, named and in the engine's order: where it quantizes before the gather, the fp8
    rows (their bytes) and their scales; the router logits (of the rows themselves: the
    router reads the activations before the quantization)."""
    out: list[tuple[str, torch.Tensor]] = []
    if rule.gather_itemsize == 1:
        q, scales = quant.quantize(rows)
        out += [("hidden_states_fp8", q), ("hidden_states_scale", scales)]
    if moe.logits_dtype is not None:
        out.append(("router_logits", moe.logits(rows)))
    return out


def _gather_side_tensors(impl: RoundTripImpl, rule: engines.Engine, plan: CPPlan,
                         local: torch.Tensor, moe: ReferenceMoE, group, shards: list[torch.Tensor],
                         rep: ImplReport) -> dict[str, torch.Tensor | None]:
    """Where the point's engine gathers side tensors beside the rows (vLLM: the router
    logits, ``moe_runner.py:828-829``; 0.34 on a monolithic block-fp8 kernel the fp8 rows and
    their scales first, ``:863-876``): this rank's tensors of the rows it gathered (a padded
    shard's padding rows too), each gathered by the implementation's ``gather_side`` (its
    ``gather`` where it has none), and ``side_tensors`` failed, naming the tensor, where a
    rank's part is not where its hidden states are. Returns what came back per name (the MoE
    routes from the logits and computes on the dequantized rows, as the engine's kernels do),
    None where it has not the layout's shape. Decided from the plan alone, so every rank
    issues the same collectives."""
    got: dict[str, torch.Tensor | None] = {}
    mine = _side_tensors(moe, rule, local)
    theirs = None
    for i, (name, tensor) in enumerate(mine):
        with observing(group) as seen:
            back = (impl.gather_side or impl.gather)(tensor, plan, group)
        _check_group(rep, seen, "side tensors' gather")
        want = stand_in((impl.buffer_rows(plan), *tensor.shape[1:]), tensor.dtype, local.device)
        diff = unlike(back, want)
        got[name] = None if diff else back
        if diff:
            rep.fail("side_tensors", f"{name} gathered beside the rows: {diff} (the hidden states' layout: "
                     f"{impl.buffer_rows(plan)} rows)")
            continue
        if theirs is None:  # every rank's tensors, made once, for the first that came back
            theirs = [_side_tensors(moe, rule, shard) for shard in shards]
        for r, start in enumerate(impl.starts(plan)):
            n, expect = plan.per_rank_tokens[r], theirs[r][i][1]
            if not bitwise_equal(back[start : start + n], expect):
                at = _found_at(back, expect) if n else None
                where = f" (found at row {at})" if at is not None and at != start else ""
                rep.fail("side_tensors", f"{name} of rank {r} are not at row {start}, where its hidden states "
                         f"are{where}: the experts would " + ("route its rows by other rows' logits"
                                                             if name == "router_logits" else
                                                             "compute on other rows than they route"))
                break
    return got


def _most_to_one_expert(moe: ReferenceMoE, rows: torch.Tensor) -> tuple[int, int]:
    """The most of ``rows`` the router sends to one expert, and that expert
    (0, -1 for no rows): identical padding rows all go to the same experts."""
    if not rows.shape[0]:
        return 0, -1
    idx, _ = moe.route(rows)
    counts = torch.bincount(idx.flatten().cpu(), minlength=moe.num_experts)
    return int(counts.max()), int(counts.argmax())


def _told_padding(impl: RoundTripImpl, plan: CPPlan, full: torch.Tensor, pads: torch.Tensor | None,
                  moe: ReferenceMoE, rep: ImplReport) -> torch.Tensor | None:
    """Where the model's router masks what it is told: the rows the
    implementation's ``is_padding`` marks (without the hook, or for an answer
    that is not one bool per row, the rows that are padding: ``pads``), and
    ``padding_routing`` failed where they are not the padding rows."""
    if impl.is_padding is None:
        return pads
    rows = impl.buffer_rows(plan)
    answer = ask(impl, "is_padding", plan)
    try:
        told = torch.as_tensor(answer)
    except (TypeError, ValueError, RuntimeError):
        told = None
    if told is None or told.dtype != torch.bool or tuple(told.shape) != (rows,):
        what = (f"a {_dtype(told)} tensor of shape {tuple(told.shape)}" if told is not None
                else type(answer).__name__)
        rep.fail("padding_routing", f"is_padding(plan) returned {what}, not one bool per row of the gathered "
                                    f"buffer ({rows} rows)")
        return pads
    told = told.to(full.device)
    truth = pads if pads is not None else torch.zeros(rows, dtype=torch.bool, device=full.device)
    starts = impl.starts(plan)

    def rank_of(row: int) -> int:
        return max(r for r, start in enumerate(starts) if start <= row)

    real = (told & ~truth).nonzero().flatten()
    if real.numel():
        first = int(real[0])
        rep.fail("padding_routing", f"is_padding marks {real.numel()} real row(s) as padding, first row {first} "
                                    f"(rank {rank_of(first)}'s): the router sends them to no expert")
    unmarked = (truth & ~told).nonzero().flatten()
    if unmarked.numel():
        first = int(unmarked[0])
        most, expert = _most_to_one_expert(moe, full[unmarked])
        rep.fail("padding_routing", f"is_padding leaves {unmarked.numel()} padding row(s) unmarked, first row "
                                    f"{first} (rank {rank_of(first)}'s): the router routes them, {most} to expert "
                                    f"{expert} (identical rows go to the same experts: its load and statistics "
                                    f"skewed)")
    return told


def _check_padding_out(rep: ImplReport, out: object, before: torch.Tensor, moe: ReferenceMoE, spec: PointSpec,
                       plan: CPPlan, n: int, masked: bool) -> None:
    """A padded shard's rows ``n_r..P`` after the round trip: what the
    engine's experts make of what its padding rows held, summed over the
    ranks (:meth:`ReferenceMoE.summed`: zero where the router masks them, the
    experts' output where it routes them; zero padding gives zero either way).
    A scatter that masks where the model routes, or routes where it masks,
    fails here, naming the rows."""
    if not isinstance(out, torch.Tensor) or out.shape != before.shape:
        return  # the reference comparison has named the shape
    content = before[n:]
    if not bool(content.ne(0).any()):
        if dirty_tail(out, n) is not None:
            rep.fail("padding_zero", f"the round trip's [{before.shape[0]}, H] shard has nonzero padding row "
                     f"{dirty_tail(out, n)} (rows {n}.. must be zero: every rank's partials are zero there)")
        return
    want = moe.summed(content, masked)
    err = max_rel_err(out[n:], want)
    tol = tolerance(DTYPES[spec.dtype], plan.cp_size)
    if not err <= tol:
        what = ("what the MoE makes of them with no routed expert: the engine's router masks them" if masked
                else "the routed experts' output on them: the engine's router routes them")
        rep.fail("padding_zero", f"the round trip's padding rows {n}..{before.shape[0] - 1} of the [{before.shape[0]}, "
                 f"H] shard are not {what} (err {err:.3g} > {tol:.3g})")


def _overcount(out: torch.Tensor, ref: torch.Tensor, moe: ReferenceMoE, local: torch.Tensor, cp: int,
               tol: float) -> str:
    """What a wrong round trip is when :func:`counted_cp_times` finds the replicated shared
    expert's output counted ``cp`` times; '' when it is not that (or nothing is replicated)."""
    if moe.shared_expert != "replicated" or not counted_cp_times(out, ref, moe.shared(local), cp, tol):
        return ""
    return (f": a replicated term counted cp times (the output is the reference plus {cp - 1} times the shared "
            f"expert's output on this rank's rows: the replicated shared expert was added to the partials before "
            f"the reduce-scatter, which summed it over the {cp} ranks; it belongs after it, once)")


def _check_group(rep: ImplReport, seen: Observed, phase: str) -> None:
    if seen.on_default:
        rep.fail("group", f"the {phase} issued {seen.on_default} collective(s) on the default group, not on the CP "
                          "group it was handed (whose ranks are in another order)")


def _read_by_global_rank(impl: RoundTripImpl, plan: CPPlan, rank: int, full: torch.Tensor,
                         out: object) -> str:
    """What a scatter's wrong output is when it is the rows it would be with
    ``dist.get_rank()`` (the global rank) where the group's rank is meant:
    the rows, or the row count, of the CP group rank that equals this
    process's global rank; '' when it is not that (or is also this rank's
    own rows). Only this rank's evidence: :func:`_global_reading_holds`
    weighs every rank's."""
    g = dist.get_rank()
    if g == rank or g >= plan.cp_size or not isinstance(out, torch.Tensor):
        return ""
    starts, n = impl.starts(plan), plan.per_rank_tokens
    if impl.shard == "padded":  # whole [P, H] blocks: every count is P
        n = [impl.stride(plan)] * plan.cp_size
    if bitwise_equal(out, full[starts[rank] : starts[rank] + n[rank]]):
        return ""
    readings = {
        (g, g): f"the rows of rank {g}",
        (rank, g): f"its own offset with rank {g}'s row count ({n[g]} rows, not {n[rank]})",
        (g, rank): f"{n[rank]} rows at rank {g}'s offset",
    }
    for (at, count), what in readings.items():
        if bitwise_equal(out, full[starts[at] : starts[at] + n[count]]):
            return (f"{what}, as if ranked by this process's global rank {g} (dist.get_rank()), not its CP group "
                    f"rank {rank} (dist.get_rank(group))")
    return ""


# What each rank's scatter probe returned, shared by every rank: its own rows,
# a reading by the global rank (:func:`_read_by_global_rank`), something else,
# or not judged (the gathered buffer was unusable).
_RIGHT, _GLOBAL, _OTHER, _UNJUDGED = range(4)


def _global_reading_holds(codes: list[int], plan: CPPlan, bystanders: int) -> bool:
    """Whether every rank's scatter is what the global rank would give: the
    ranks whose global rank is a CP group rank other than their own read by
    it, and the ranks whose global rank is their own right. One rank that
    is not (a neighbour's rows where the global rank names the rank itself)
    makes it a wrong offset, not a global rank."""
    ranks = cp_ranks(plan.cp_size, bystanders)
    for r, code in enumerate(codes):
        g = ranks[r]
        if code == _UNJUDGED or (g == r and code != _RIGHT) or (g != r and g < plan.cp_size and code != _GLOBAL):
            return False
    return True


_SEARCH_ROWS = 4096


def _found_at(full: torch.Tensor, out: object, limit: int = 64) -> int | None:
    """The first row of ``full`` from which ``out``'s rows follow byte-exact,
    or None (not a tensor of ``full``'s dtype and width, empty, or nowhere)."""
    if not (isinstance(out, torch.Tensor) and out.dtype == full.dtype and out.dim() == 2 and out.device == full.device
            and out.shape[1:] == full.shape[1:] and 0 < out.shape[0] <= full.shape[0]):
        return None
    fb = as_bytes(full).reshape(full.shape[0], -1)
    ob = as_bytes(out).reshape(out.shape[0], -1)
    k, tried = ob.shape[0], 0
    # In blocks of rows: one comparison of a production-sized buffer at once
    # would hold a byte per element.
    for lo in range(0, fb.shape[0] - k + 1, _SEARCH_ROWS):
        block = fb[lo : min(lo + _SEARCH_ROWS, fb.shape[0] - k + 1)]
        for at in (block == ob[0]).all(dim=1).nonzero().flatten().tolist():
            if torch.equal(fb[lo + at : lo + at + k], ob):
                return lo + at
            tried += 1
            if tried >= limit:
                return None
    return None


def _share(code: int, group, device) -> list[int]:
    """Every rank's ``code``, on every rank (a collective: every rank calls it).
    An all-reduce, as the agreement after the checks is: a rank that skipped
    an implementation's all-gather or reduce-scatter meets it in another
    collective (``collective_skipped``), not in a like one of other shapes."""
    every = torch.zeros(dist.get_world_size(group), dtype=torch.int64, device=device)
    every[dist.get_rank(group)] = code
    dist.all_reduce(every, group=group)
    return every.tolist()


def _not_run(rep: ImplReport, checks: list[str]) -> None:
    """Say, in the ``gather_shape`` failure, which checks did not run: they
    read the gathered buffer, and judging them on a stand-in would add
    failures that are not the implementation's."""
    for k, (check, msg) in enumerate(rep.failures):
        if check == "gather_shape":
            rep.failures[k] = (check, f"{msg}; not run on a buffer of the wrong size: {', '.join(checks)}")
            return


def check_refusal(impl: RoundTripImpl, spec: PointSpec, plan: CPPlan, device, local: torch.Tensor,
                  group) -> ImplReport:
    """An even-only implementation on an uneven plan: gather and scatter must
    each raise (legacy: torch's text) without issuing any collective."""
    rep = ImplReport()
    full = torch.zeros((plan.total_tokens, spec.hidden_size), dtype=local.dtype, device=device)
    notes = []
    for phase, call in (("gather", lambda: impl.gather(local, plan, group)),
                        ("scatter", lambda: impl.scatter(full, plan, group))):
        t0 = time.perf_counter()
        raised = ""
        with observing(group) as seen:
            try:
                call()
            except Exception as exc:  # noqa: BLE001 - the refusal is what is checked
                raised = f"{type(exc).__name__}: {' '.join(str(exc).split())}"
        took = time.perf_counter() - t0
        if not raised:
            rep.fail("refusal", f"{phase} accepted an uneven plan (per_rank_tokens={list(plan.per_rank_tokens)})")
        elif seen.issued:
            rep.fail("refusal", f"{phase} raised only after issuing {seen.describe()}: {raised}")
        elif impl.name == "legacy" and not raised.startswith(f"ValueError: {LEGACY_UNEVEN_ERROR}"):
            rep.fail("refusal", f"{phase} raised {raised!r}, not torch's ValueError text")
        notes.append(f"{phase}: {raised} after {took * 1e3:.1f} ms, no collective")
    if not rep.failures:
        rep.status = "refused"
        rep.reason = notes[0]
    rep.correct = not rep.failures
    return rep


def check_passthrough(plan: CPPlan, rank: int, local: torch.Tensor, shards: list[torch.Tensor]) -> ImplReport:
    """SCATTERED mode: the CP communicator hands the MoE its own rows untouched."""
    rep = ImplReport(status="passthrough", reason="SCATTERED: the communicator moves no rows (no collective, no timing)")
    comm = CPLayerCommunicator(plan, ScatterMode.SCATTERED)
    moe_in = comm.prepare_mlp(local)
    out = comm.postprocess(moe_in)
    if not (moe_in is local and out is local and bitwise_equal(out, shards[rank])):
        rep.fail("passthrough", "SCATTERED mode changed the rows")
        rep.status = ""
    rep.correct = not rep.failures
    return rep


def _check_layout(impl: RoundTripImpl, spec: PointSpec, plan: CPPlan, rank: int, device,
                  local: torch.Tensor, group, shards: list[torch.Tensor],
                  rep: ImplReport) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """The checks of one round trip that need no reference MoE: ``group``,
    ``input_mutated``, the gathered buffer's (:func:`check_gather`) and
    ``scatter_chunk``. Returns the gathered buffer (zeros of its size when it
    is unusable), a copy of ``local`` as it was given, and whether the
    gathered buffer was usable: when it is not, what reads it is not judged
    (``scatter_chunk`` is said not run), but its collectives still run, so
    that every rank issues the same collectives as its peers."""
    before = local.clone()
    with observing(group) as seen:
        full = impl.gather(local, plan, group)
    _check_group(rep, seen, "gather")
    if not bitwise_equal(local, before):
        rep.fail("input_mutated", "the gather modified its input rows")
    usable = check_gather(impl, full, spec, plan, device, rep, shards)
    if not usable:
        full = torch.zeros((impl.buffer_rows(plan), spec.hidden_size), dtype=local.dtype, device=device)
    probe = full.clone() if rank == 0 else torch.zeros_like(full)
    with observing(group) as seen:
        out = impl.scatter(probe, plan, group)
    _check_group(rep, seen, "scatter")
    right = isinstance(out, torch.Tensor) and bitwise_equal(out, before)
    n = plan.per_rank_tokens[rank]
    if (not right and impl.shard == "padded" and isinstance(out, torch.Tensor) and out.shape == before.shape
            and bitwise_equal(out[:n], before[:n])):
        # the rows are right. Padding rows of zeros must come back zero; rows the engine filled
        # (vLLM's token-0 rows) are its router's to mask or route, judged after the MoE step
        if dirty_tail(before, n) is None:
            rep.fail("padding_zero", f"the scatter's [{before.shape[0]}, H] shard has nonzero padding row "
                     f"{dirty_tail(out, n)} (rows {n}.. must be zero: every rank's partials are zero there)")
        right = True
    global_read = "" if right or not usable else _read_by_global_rank(impl, plan, rank, full, out)
    code = _UNJUDGED if not usable else _RIGHT if right else _GLOBAL if global_read else _OTHER
    codes = _share(code, group, device)
    if usable and not right:
        if global_read and _global_reading_holds(codes, plan, spec.bystanders):
            rep.fail("group", f"the scatter returned {global_read}")
        else:
            diff = unlike(out, before)
            start = impl.starts(plan)[rank]
            at = _found_at(full, out)
            where = ""
            if at is not None and at != start:
                where = (f"; its {out.shape[0]} rows are the gathered buffer's rows {at}..{at + out.shape[0] - 1}: "
                         f"rows at the wrong offset {at}, not {start} (off by {at - start:+d})")
            rep.fail("scatter_chunk", "scattering rank 0's copy of the gathered buffer did not return this rank's rows"
                     + (f": {diff}" if diff else "") + where)
    return full, before, usable


def check_light(impl: RoundTripImpl, spec: PointSpec, plan: CPPlan, rank: int, device,
                local: torch.Tensor, group, shards: list[torch.Tensor]) -> ImplReport:
    """The light checks of one FULL-mode implementation on this rank: every
    check of :func:`check_full` but ``reference_moe`` and ``even_bitwise``
    (the layout, the rows and the chunk byte-exact, the refusal, the group),
    with no reference MoE: its weights and float64 routing of the whole
    gathered buffer on every rank do not fit a production-shape point of 8
    ranks in a small machine's memory."""
    if impl.needs_even and not plan.is_even:
        return check_refusal(impl, spec, plan, device, local, group)
    rep = ImplReport()
    _, _, usable = _check_layout(impl, spec, plan, rank, device, local, group, shards, rep)
    if not usable:
        _not_run(rep, ["scatter_chunk"])
    rep.correct = not rep.failures
    return rep


def check_full(impl: RoundTripImpl, spec: PointSpec, plan: CPPlan, rank: int, device,
               local: torch.Tensor, moe: ReferenceMoE, group, shards: list[torch.Tensor]) -> ImplReport:
    """Every FULL-mode check of one implementation on this rank (``local``:
    this implementation's own copy of the rank's rows; ``shards``: every
    rank's rows, for comparison)."""
    if impl.needs_even and not plan.is_even:
        return check_refusal(impl, spec, plan, device, local, group)
    rep = ImplReport()
    full, before, usable = _check_layout(impl, spec, plan, rank, device, local, group, shards, rep)
    # The padding rows of the gathered buffer go through the experts as the engine's router for its
    # model sends them: to no expert (masked), or routed like any row (processed).
    rule = engines.of(plan)
    pads = padding_mask(impl, plan, full.device)
    masked = _told_padding(impl, plan, full, pads, moe, rep) if rule.moe_pad_masked else None
    side = _gather_side_tensors(impl, rule, plan, before, moe, group, shards, rep)
    # Where the engine gathers the rows quantized, the experts compute on the fp8 rows that came back
    # with their scales, dequantized; on the gathered rows' own where it does not, or a part did not come back.
    q, scales = side.get("hidden_states_fp8"), side.get("hidden_states_scale")
    experts_rows = quant.dequantize(q, scales, full.dtype) if q is not None and scales is not None else None
    partial = moe.partial(full, rank, plan.cp_size, masked, side.get("router_logits"), experts_rows)
    if pads is not None:  # the padding rows the router masked, and the most of the others one expert got
        rep.pad_rows_masked = int((pads & masked).sum()) if masked is not None else 0
        rep.pad_expert_max = _most_to_one_expert(moe, full[pads if masked is None else pads & ~masked])[0]
    n = plan.per_rank_tokens[rank]
    # A replicated shared expert: every rank's whole output on the gathered
    # rows, handed to the implementation beside the partials, to add once.
    out = impl.scatter_moe(partial.clone(), moe.replicated(full), plan, group)
    del partial  # legacy's recomputation below holds its own: one gathered buffer's worth less at the peak
    if usable:
        padded_ok = impl.shard == "padded" and isinstance(out, torch.Tensor) and out.shape == before.shape
        # a padded shard's real rows against the reference; its padding rows against what the engine's
        # experts make of them (below)
        _compare_to_reference(rep, out[:n] if padded_ok else out, before[:n] if padded_ok else before, moe, spec,
                              plan, "round trip")
        if impl.shard == "padded":
            _check_padding_out(rep, out, before, moe, spec, plan, n, rule.moe_pad_masked)
    if impl.claims_legacy_bits(plan):
        # Legacy on the same inputs: the padded algorithm with m*cp == T must
        # give its bytes, through the general path (no even-plan shortcut).
        # Decided from the plan alone, so every rank issues these collectives.
        # (A padded shard's rows are its first n_r: legacy takes those.)
        before = before[:n]
        lf = legacy_gather(before, plan, group)
        lo = legacy_scatter(moe.partial(lf, rank, plan.cp_size).clone(), plan, group)
        shared = moe.replicated(lf)
        if shared is not None:  # the same rows of the same term, added the same way, after legacy's sum
            lo = add_replicated(lo, shared, impl_registry.get("legacy"), plan, rank)
        if usable:
            rep.even_bitwise_equal = (bitwise_equal(full, lf) and isinstance(out, torch.Tensor)
                                      and bitwise_equal(out, lo))
            if not rep.even_bitwise_equal:
                rep.fail("even_bitwise", "even plan: results differ from legacy's bit for bit")
    if not usable:
        _not_run(rep, ["scatter_chunk", "reference_moe",
                       *(["even_bitwise"] if plan.is_even and impl.legacy_bits_on_even else [])])
    rep.correct = not rep.failures
    return rep


def check_dispatch(impl: DispatchImpl, spec: PointSpec, plan: CPPlan, rank: int, local: torch.Tensor,
                   moe: ReferenceMoE, group, shards: list[torch.Tensor]) -> ImplReport:
    """Dispatch -> this rank's experts with the routing weights -> combine; the
    dispatched rows must be exactly the rows routed here, and the combined
    ``[n_r, H]`` must match the single-process reference MoE."""
    from ..alternatives import a2a_expected_recv, a2a_experts

    rep = ImplReport()
    experts = moe.experts_of(rank, plan.cp_size)
    before = local.clone()
    idx, weight = moe.route(local)
    x_recv, handle = impl.dispatch(local, idx, weight, len(experts), group)
    rep.rows_sent = int(getattr(handle, "rows_sent", 0) or 0)
    if not bitwise_equal(local, before):
        rep.fail("input_mutated", "the dispatch modified its input rows")
    if not (isinstance(x_recv, torch.Tensor) and bitwise_equal(x_recv, a2a_expected_recv(shards, moe, rank))):
        rep.fail("dispatch_rows", f"dispatched rows differ from the rows routed to rank {rank}")
    out = impl.combine(a2a_experts(moe, x_recv, handle, experts), handle, group)
    if moe.shared_expert != "none" and isinstance(out, torch.Tensor) and out.shape == before.shape \
            and out.dtype == before.dtype:
        # A rank holds only its own tokens here: the shared expert runs whole on
        # them and is added after the combine, whichever placement the point names.
        out = out + moe.shared(before).to(before.dtype)
    _compare_to_reference(rep, out, before, moe, spec, plan, "a2a round trip")
    rep.correct = not rep.failures
    return rep
