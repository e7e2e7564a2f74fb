"""mlp_mode / ScatterMode and the communicator's local decisions."""

from __future__ import annotations

import pytest
import torch

from nsa_cp_comm import A2A_BACKENDS, CPLayerCommunicator, ScatterMode, mlp_mode, plan_split


def test_none_backend_sparse_layer_is_full():
    assert mlp_mode("none") is ScatterMode.FULL
    assert mlp_mode("none", sparse_layer=True) is ScatterMode.FULL


@pytest.mark.parametrize("backend", ["deepep", "mooncake", "mori", "ascend_fuseep", "flashinfer"])
def test_a2a_backends_are_scattered(backend):
    assert backend in A2A_BACKENDS
    assert mlp_mode(backend) is ScatterMode.SCATTERED


@pytest.mark.parametrize("backend", A2A_BACKENDS)
def test_dense_layers_stay_scattered(backend):
    assert mlp_mode(backend, sparse_layer=False) is ScatterMode.SCATTERED


def test_only_none_is_full():
    assert [b for b in A2A_BACKENDS if mlp_mode(b) is ScatterMode.FULL] == ["none"]


@pytest.mark.parametrize("backend", ["DeepEP", "nccl", "", "allgather", None, "none "])
def test_unknown_backend_lists_valid_ones(backend):
    with pytest.raises(ValueError) as info:
        mlp_mode(backend)
    msg = str(info.value)
    assert repr(backend) in msg
    assert all(b in msg for b in A2A_BACKENDS), msg


def test_scatter_mode_values():
    assert str(ScatterMode.FULL) == "FULL" and str(ScatterMode.SCATTERED) == "SCATTERED"
    assert ScatterMode("FULL") is ScatterMode.FULL
    assert {m.value for m in ScatterMode} == {"FULL", "SCATTERED"}
    with pytest.raises(ValueError):
        ScatterMode("GATHERED")


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
