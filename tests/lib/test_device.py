"""Device-explicit timing: the clock records and waits on the rank's own
device, never on the calling thread's current one (CUDA's current device is
per host thread; a point may run in a thread that never set it). Checked
without a GPU through a recording stand-in for torch.cuda's calls."""

from __future__ import annotations

import threading

import pytest
import torch

from nsa_cp_comm.harness import timing


class FakeCuda:
    """Records which device each CUDA call names; the thread's current device is 0."""

    def __init__(self, monkeypatch):
        self.calls: list[tuple[str, object]] = []
        fake = self

        class Event:
            def __init__(self, enable_timing=False):
                self.stream = None

            def record(self, stream=None):
                fake.calls.append(("record", stream))

            def elapsed_time(self, other):
                return 1.5

        class Stream:
            def __init__(self, device):
                self.device = device

            def __repr__(self):
                return f"Stream({self.device})"

        monkeypatch.setattr(torch.cuda, "Event", Event)
        monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: Stream(device))
        monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: fake.calls.append(("synchronize", device)))
        monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)


def test_clock_records_and_syncs_on_its_own_device(monkeypatch):
    fake = FakeCuda(monkeypatch)
    dev = torch.device("cuda", 3)
    clock = timing.Clock(dev)
    a = clock.mark()
    b = clock.mark()
    clock.sync()
    assert clock.elapsed_us(a, b) == 1500.0
    kinds = [k for k, _ in fake.calls]
    assert kinds == ["record", "record", "synchronize"]
    # Every call names device 3, never the thread's current device 0 (or None).
    assert [arg.device for k, arg in fake.calls if k == "record"] == [dev, dev]
    assert [arg for k, arg in fake.calls if k == "synchronize"] == [dev]


def test_clock_refuses_a_cuda_device_without_an_index():
    with pytest.raises(ValueError, match="explicit CUDA device index"):
        timing.Clock(torch.device("cuda"))


def test_timed_loop_syncs_the_steps_device(monkeypatch):
    """The one timed loop times through the clock it is given."""
    fake = FakeCuda(monkeypatch)
    monkeypatch.setattr(torch.distributed, "barrier", lambda group=None: None)
    dev = torch.device("cuda", 5)
    steps = [timing.Steps("x", [("gather", lambda i: None), ("scatter", lambda i: None)])]
    out = timing.timed_loop(steps, warmup=1, iters=2, clock=timing.Clock(dev))
    assert out == {"x": {"gather": [1500.0, 1500.0], "scatter": [1500.0, 1500.0]}}
    assert {arg for k, arg in fake.calls if k == "synchronize"} == {dev}
    assert {arg.device for k, arg in fake.calls if k == "record"} == {dev}


@pytest.mark.requires_gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="requires a CUDA GPU")
def test_clock_on_a_real_gpu_from_a_thread_that_never_set_the_device():
    dev = torch.device("cuda", torch.cuda.device_count() - 1)
    box = {}

    def body():
        clock = timing.Clock(dev)
        x = torch.ones(1 << 20, device=dev)
        a = clock.mark()
        x.mul_(2)
        b = clock.mark()
        clock.sync()
        box["us"] = clock.elapsed_us(a, b)

    t = threading.Thread(target=body)
    t.start()
    t.join()
    assert box["us"] >= 0
