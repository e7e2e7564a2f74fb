"""mlp_mode / ScatterMode and the communicator's local decisions."""

from __future__ import annotations

import pytest
import torch

from nsa_cp_comm import A2A_BACKENDS, CPLayerCommunicator, ScatterMode, mlp_mode, plan_split


def test_only_sparse_layers_on_the_all_gather_path_are_full():
    """FULL for a sparse layer with no a2a backend; every a2a backend routes
    rows itself and every dense layer stays local."""
    modes = {(b, sparse): mlp_mode(b, sparse_layer=sparse) for b in A2A_BACKENDS for sparse in (True, False)}
    assert {key for key, mode in modes.items() if mode is ScatterMode.FULL} == {("none", True)}
    assert set(modes.values()) == {ScatterMode.FULL, ScatterMode.SCATTERED}
    assert mlp_mode("none") is ScatterMode.FULL  # a layer is sparse unless said otherwise


@pytest.mark.parametrize("backend", ["DeepEP", "nccl", "", "allgather", None, "none "])
def test_unknown_backend_lists_valid_ones(backend):
    with pytest.raises(ValueError) as info:
        mlp_mode(backend)
    msg = str(info.value)
    assert repr(backend) in msg
    assert all(b in msg for b in A2A_BACKENDS), msg


def test_scatter_mode_prints_and_parses_as_its_value():
    # rows and configs hold the bare value: str() and format() give it, and it parses back
    for mode in ScatterMode:
        assert str(mode) == f"{mode}" == mode.value and ScatterMode(str(mode)) is mode
    with pytest.raises(ValueError) as info:
        ScatterMode("GATHERED")
    assert str(info.value) == "mlp_mode='GATHERED' is not one of SCATTERED, FULL"


# Decisions the communicator takes without any collective (no process group needed).

def test_scattered_and_no_plan_pass_rows_through():
    plan = plan_split([1001, 300], 2, policy="zigzag")
    x = torch.randn(5, 8)
    for comm in (CPLayerCommunicator(plan, mlp_mode("deepep")), CPLayerCommunicator(None, ScatterMode.FULL),
                 CPLayerCommunicator(None, "SCATTERED", impl="legacy"),
                 CPLayerCommunicator(plan, ScatterMode.SCATTERED, impl="legacy")):
        assert not comm.moves_rows
        assert comm.prepare_mlp(x) is x
        assert comm.postprocess(x) is x


def test_full_mode_with_plan_moves_rows():
    plan = plan_split([8], 2, policy="round_robin")
    comm = CPLayerCommunicator(plan, "FULL")
    assert comm.mode is ScatterMode.FULL and comm.moves_rows and comm.impl == "padded"


@pytest.mark.parametrize("impl", ["fast", "", "Padded", None])
def test_unknown_impl_is_rejected(impl):
    with pytest.raises(ValueError) as info:
        CPLayerCommunicator(None, ScatterMode.FULL, impl=impl)
    assert repr(impl) in str(info.value) and "padded" in str(info.value) and "legacy" in str(info.value)


def test_unknown_mode_is_rejected():
    with pytest.raises(ValueError):
        CPLayerCommunicator(None, "GATHERED")
