"""An error row says where in the implementation's own code it was raised, and in which step."""

from __future__ import annotations

import dataclasses

from nsa_cp_comm import impls
from nsa_cp_comm.harness.sites import implementation_site


def _boom(*args):
    raise RuntimeError("The size of tensor a (885) must match the size of tensor b (7080)")


def _site(call) -> str:
    try:
        call()
    except RuntimeError as exc:
        return implementation_site(exc.__traceback__)
    raise AssertionError("did not raise")


def test_the_line_and_the_step_of_a_plugins_raise_are_named():
    here = "tests/harness/test_sites.py"
    impl = dataclasses.replace(impls.get("padded"), scatter=_boom, scatter_replicated=_boom)
    # the library calls the hook: the step is the hook it called
    got = _site(lambda: impl.scatter_moe(None, None, None, None))
    assert got.startswith(f" (raised at {here}:") and got.endswith(" in _boom, in the implementation's scatter)"), got
    got = _site(lambda: impl.scatter_moe(None, object(), None, None))
    assert got.endswith(" in _boom, in the implementation's scatter_replicated)"), got


def test_an_error_inside_the_library_names_no_site():
    """As a rank sees a built-in's error: every frame below the catching one in the library."""
    from nsa_cp_comm.plan import plan_split

    try:
        plan_split([1], 0, policy="zigzag")
    except ValueError as exc:
        assert implementation_site(exc.__traceback__.tb_next) == ""  # this test's own frame left out
        assert implementation_site(exc.__traceback__).endswith(" in test_an_error_inside_the_library_names_no_site)")
