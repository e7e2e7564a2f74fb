"""An example serving engine's CP layer communicator (see communicator.py) and
its adapter to nsa_cp_comm's implementation protocol (adapter.py)."""

__version__ = "0.3.1"
