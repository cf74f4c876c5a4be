"""The fork server's imports (core/train/preload.py) start no CUDA: a run forked from a server that started CUDA
cannot use the GPU, so on a GPU machine every run would start cold (run 10: bitsandbytes' import asked torch for the
GPU's compute capability, and torch made a CUDA context to answer).

The check is torch's own: every path to a CUDA context goes through torch.cuda._lazy_init (get_device_capability,
get_device_properties, current_device, set_device, synchronize...), here recorded with its caller and called through
unchanged. On a machine without CUDA torch refuses there, so a call that would have started CUDA is still recorded
(and the libraries catch the refusal); on a GPU machine the same test also shows bitsandbytes loaded its CUDA library.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the fork server is Linux-only")

PROBE = r"""
import json, sys, traceback
import torch
calls = []
original = torch.cuda._lazy_init
def recorded():
    calls.append("".join(traceback.format_stack(limit=12)[:-1]))
    return original()
torch.cuda._lazy_init = recorded
before = torch.cuda.get_device_capability
import core.train.preload as preload
import bitsandbytes
from bitsandbytes import cextension
print(json.dumps({
    "calls": calls,
    "initialized": torch.cuda.is_initialized(),
    "fork_safe": preload.fork_safe(preload.STARTED_WITH),
    "restored": torch.cuda.get_device_capability is before,
    "cuda": torch.cuda.is_available(),
    "backend": cextension.BNB_BACKEND,
    "cuda_library": type(cextension.lib).__name__,
    "nvml_answered": preload.NVML_ANSWERED,
    "bitsandbytes_as_cold": preload.BITSANDBYTES_AS_COLD,
}))
"""


def test_the_fork_servers_imports_start_no_cuda_and_leave_torch_as_it_was():
    done = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["calls"] == [], "CUDA is started at import by:\n" + "\n---\n".join(seen["calls"])
    assert seen["initialized"] is False
    assert seen["fork_safe"] == ""  # a run in the server's own environment is forked warm
    assert seen["restored"]  # torch.cuda.get_device_capability is torch's own again
    assert seen["bitsandbytes_as_cold"]
    if seen["cuda"]:  # a GPU machine: NVML answered, and bitsandbytes loaded what a cold run loads, its CUDA library
        assert seen["nvml_answered"]
        assert (seen["backend"], seen["cuda_library"]) == ("CUDA", "CudaBNBNativeLibrary")
    else:  # no GPU: torch's own answer stood (nothing asked it)
        assert not seen["nvml_answered"] and seen["backend"] == "CPU"


@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs an NVIDIA GPU and its driver")
def test_nvml_says_the_compute_capability_torch_says():
    script = ("import torch, json\nfrom core.train.preload import _nvml_capability\n"
              "n = torch.cuda.device_count()\n"
              "nvml = [_nvml_capability(torch.cuda.device(i)) for i in range(n)]\n"
              "print(json.dumps([nvml, [torch.cuda.get_device_capability(i) for i in range(n)]]))")
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    nvml, torch_says = json.loads(done.stdout.strip().splitlines()[-1])
    assert nvml == torch_says and nvml
