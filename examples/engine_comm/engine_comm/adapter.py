"""engine_comm's communicator as an nsa_cp_comm round trip: what the matrix runs."""

from nsa_cp_comm.impls import RoundTripImpl

from engine_comm.communicator import ContextParallelCommunicator


def gather(local, plan, group):
    # Built per call from the plan every rank shares, as the engine does per batch.
    return ContextParallelCommunicator(plan.per_rank_tokens, group).prepare_mlp(local)


def scatter(partials, plan, group):
    return ContextParallelCommunicator(plan.per_rank_tokens, group).postprocess(partials)


impl = RoundTripImpl(
    "engine_comm", gather, scatter,
    layout="rank_major_padded",  # rank r's rows at r * max_rank_len, zero padding after them
    backends=("gloo", "nccl"),
    needs_even=False,  # pads uneven shards itself
    legacy_bits_on_even=True,  # on even plans: legacy's bytes (nothing is padded)
    doc="engine_comm.ContextParallelCommunicator: prepare_mlp / postprocess",
)
