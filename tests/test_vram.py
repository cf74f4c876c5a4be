"""core.gpus.vram on a machine without an NVIDIA driver (CI, this box): answers "no NVIDIA GPU found", never raises."""

import sys
import threading
import types

import pytest

from core import nvml
from core.gpus import vram


def fresh_nvml_state(monkeypatch):
    """NVML not yet initialised in this process (the real state comes back after the test)."""
    monkeypatch.setattr(nvml, "_state", {"tried": False, "ok": False, "error": ""})


@pytest.fixture
def no_pynvml(monkeypatch):
    """Simulate a machine without the NVML package (mocking its absence only)."""
    monkeypatch.setitem(sys.modules, "pynvml", None)
    fresh_nvml_state(monkeypatch)


def test_snapshot_never_raises_and_says_why():
    snap = vram.snapshot()
    assert isinstance(snap, vram.GpuSnapshot)
    if not snap.ok:  # this CPU machine: no driver
        assert snap.gpus == [] and snap.message == vram.NO_GPU
    else:  # a GPU machine: sane numbers
        g = snap.gpus[0]
        assert g.total_bytes > 0 and 0 <= g.used_bytes <= g.total_bytes and g.name


def test_without_pynvml_the_message_path(no_pynvml):
    snap = vram.snapshot()
    assert snap == vram.GpuSnapshot(gpus=[], message="no NVIDIA GPU found")
    assert not snap.ok
    assert vram.nvml_available() is False
    assert vram.device_used_bytes(0) is None
    assert "ImportError" in nvml.error() or "import" in nvml.error().lower()


def test_nvml_is_initialised_once_across_threads(monkeypatch):
    calls = []

    def failing_init():  # a machine whose driver is missing: init fails, and must not be retried
        calls.append(1)
        raise RuntimeError("NVML Shared Library Not Found")

    monkeypatch.setitem(sys.modules, "pynvml", types.SimpleNamespace(nvmlInit=failing_init))
    fresh_nvml_state(monkeypatch)
    threads = [threading.Thread(target=vram.snapshot) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1
    assert vram.snapshot().message == vram.NO_GPU


def test_peak_tracker_without_nvml_reports_none(no_pynvml):
    tracker = vram.PeakTracker(interval=0.1, series=True)
    with tracker:
        pass
    assert tracker.peak_bytes is None and tracker.peak_gib is None and tracker.samples == 0
    # "not available", and why: what the benchmarks write instead of a peak
    assert tracker.available is False and tracker.series == []
    assert tracker.message.startswith(vram.NO_GPU) and "pynvml" in tracker.message
    assert vram.device_count() == 0 and vram.process_used_bytes(1) is None and vram.device_utilization() is None


def test_the_sampler_thread_keeps_the_peak_and_the_series(monkeypatch):
    """The one sampler's thread (the run, the app and the benchmarks use it), fed by a fake device reading."""
    served, enough = [], threading.Event()
    readings = [2, 5, 3, 9, 1, 4, 7, 2]

    def used(index=0):
        value = readings[len(served) % len(readings)] * vram.GIB
        served.append(value)
        if len(served) >= 12:
            enough.set()
        return value

    monkeypatch.setattr(vram, "unavailable_reason", lambda: "")
    monkeypatch.setattr(vram, "device_used_bytes", used)
    monkeypatch.setattr(vram, "device_utilization", lambda index=0: 42)
    tracker = vram.PeakTracker(interval=0.001, series=True, util_every=3).start()
    assert tracker.available and tracker.message == ""
    assert enough.wait(60)  # a bound for a loaded machine, not a timing assert
    tracker.stop()
    assert tracker.samples == len(served) == len(tracker.series)
    assert tracker.peak_bytes == max(served) == 9 * vram.GIB and tracker.peak_gib == 9.0
    assert [u for _, u, _ in tracker.series] == served
    assert {util for _, _, util in tracker.series} == {42}
    times = [t for t, _, _ in tracker.series]
    assert times == sorted(times)
    tracker.interval = 3600  # the thread then never samples between start and stop: exactly their two readings
    again = tracker.start()  # a second start measures afresh
    again.stop()
    assert again.samples == 2 and again.series[0][1] == served[-2]


def test_peak_tracker_keeps_the_maximum(monkeypatch):
    readings = iter([1 * vram.GIB, 3 * vram.GIB, 2 * vram.GIB])
    monkeypatch.setattr(vram, "device_used_bytes", lambda index=0: next(readings, None))
    tracker = vram.PeakTracker()
    for _ in range(4):
        tracker.sample()
    assert tracker.peak_bytes == 3 * vram.GIB and tracker.peak_gib == 3.0 and tracker.samples == 3


def test_torch_peaks_is_none_without_cuda():
    import torch

    if torch.cuda.is_available():
        peaks = vram.torch_peaks()
        assert set(peaks) == {"allocated_gib", "reserved_gib", "peak_allocated_gib", "peak_reserved_gib"}
    else:
        assert vram.torch_peaks() is None


def test_format_usage():
    assert vram.format_usage(int(10.87 * vram.GIB), 140 * vram.GIB) == "10.9 / 140.0 GiB (8%)"
    assert vram.format_usage(0, 0) == "0.0 / 0.0 GiB (0%)"
    g = vram.GpuInfo(0, "NVIDIA H200", 70 * vram.GIB, 100 * vram.GIB)
    assert g.label == "GPU 0 NVIDIA H200: 70.0 / 100.0 GiB (70%)"


@pytest.mark.parametrize("fraction, colour", [
    (0.0, "green"), (0.699, "green"), (0.70, "amber"), (0.899, "amber"), (0.90, "red"), (1.2, "red")])
def test_band(fraction, colour):
    assert vram.band(fraction) == colour
