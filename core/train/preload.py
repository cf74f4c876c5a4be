"""What the job manager's fork server imports once (core/jobs/warm.py), so that each run forked from it starts
with the libraries already loaded (core/train/libraries.py): torch, transformers, peft, trl, datasets and
bitsandbytes cost 5-7 s of CPU per process to import, more than the demo's whole training. They are in gc's
permanent generation (core.files.long_lived): a forked run's collections skip them, and it shares their memory
pages with the server instead of copying those gc would write to (what Python's gc.freeze documents for fork).

It also records whether the server's state may be forked into a training process: nothing may have started CUDA
(a forked child cannot use a CUDA context its parent made) or a second thread (a forked child gets only the
forking thread, so a lock another thread held would never be released). `fork_safe` answers per run; where it
says no, the child becomes a fresh interpreter instead (core/jobs/warm.py), exactly as before.

On a GPU machine the imports would start CUDA: bitsandbytes (imported by peft, which trl imports) asks torch for
the GPU's compute capability while importing, and torch makes a CUDA context to answer (bench/RESULTS.md run 10:
every run on the H200 started cold). Here NVML answers that one question instead (`_no_cuda_context`), and the server checks that
bitsandbytes still loaded its CUDA library, as a cold run's import does.
"""

from __future__ import annotations

import os

# The environment the server started with: what the libraries below read while importing (HF_HOME, HF_HUB_OFFLINE,
# CUDA_VISIBLE_DEVICES...). A run whose own environment differs in any of it starts cold.
STARTED_WITH = dict(os.environ)
# torch.cuda.is_available() through NVML: it answers without initializing CUDA in this process (torch's own
# fork-safe check). Set before torch is imported; a run's own environment decides for the run (see IGNORED).
os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")  # (not in STARTED_WITH's comparison: IGNORED)

import contextlib  # noqa: E402
from ctypes import CDLL, byref, c_int, c_uint, c_void_p  # noqa: E402

from core.files import long_lived  # noqa: E402


def _nvml_capability(device=None) -> tuple[int, int]:
    """torch.cuda.get_device_capability's answer, read from NVML (the driver's management library, which torch's own
    fork-safe checks use) instead of from a CUDA context: torch makes one to answer, and a forked run cannot use it."""
    import torch

    if isinstance(device, str):
        device = torch.device(device)
    index = device.idx if isinstance(device, torch.cuda.device) else getattr(device, "index", device)
    index = 0 if index is None else index  # torch's current device, which is 0 until a context is made
    nvml = CDLL("libnvidia-ml.so.1")
    handle, major, minor = c_void_p(), c_int(), c_int()
    if (nvml.nvmlInit_v2() or nvml.nvmlDeviceGetHandleByIndex_v2(c_uint(torch.cuda._get_nvml_device_index(index)),
                                                                byref(handle))
            or nvml.nvmlDeviceGetCudaComputeCapability(handle, byref(major), byref(minor))):
        raise RuntimeError("NVML could not say the GPU's compute capability")
    return major.value, minor.value


@contextlib.contextmanager
def _no_cuda_context():
    """While the libraries import here, torch.cuda.get_device_capability answers from NVML. bitsandbytes 0.50
    (cextension.get_native_library -> cuda_specs.get_compute_capabilities) asks it at import to know that a GPU
    exists before loading its CUDA library (which it picks by torch.version.cuda alone), and peft and trl import
    bitsandbytes; torch answers by initializing CUDA, which made every run on a GPU machine start cold. The answer
    is the same; nothing else changes, and torch's own function is back once the imports are done. Where NVML
    cannot answer (no NVIDIA driver, CUDA already started) torch's own answer stands."""
    import torch

    global NVML_ANSWERED
    original = torch.cuda.get_device_capability
    usable = torch.cuda.is_available() and not torch.cuda.is_initialized()  # NVML-based here: starts nothing
    try:
        if usable:
            for i in range(torch.cuda.device_count()):  # NVML answers for every visible GPU, or torch's own stays
                _nvml_capability(torch.cuda.device(i))
            torch.cuda.get_device_capability = _nvml_capability
            NVML_ANSWERED = True
    except Exception:  # noqa: BLE001 - any failure (no libnvidia-ml, MIG ids...): torch's own answer, as before
        pass
    try:
        yield
    finally:
        torch.cuda.get_device_capability = original


NVML_ANSWERED = False  # set when the imports below were answered by NVML


def _bitsandbytes_as_cold() -> bool:
    """Whether bitsandbytes loaded what a cold run's import loads: with NVML's answers, its CUDA library on a GPU
    machine. A server where it did not (bitsandbytes' own check failed quietly: it catches everything and falls back
    to its CPU library) must not fork runs that would then quantize without their GPU kernels."""
    import sys

    cext = sys.modules.get("bitsandbytes.cextension")
    return not NVML_ANSWERED or cext is None or isinstance(cext.lib, cext.CudaBNBNativeLibrary)


with long_lived(), _no_cuda_context():  # they live as long as the server and every run forked from it
    import torch  # noqa: E402

    import core.train.cli  # noqa: E402, F401
    import core.train.libraries  # noqa: E402, F401

# What the imports themselves set (e.g. torch inductor's cache folder): a warm run keeps it, as a cold one would.
SET_BY_IMPORTS = {k: v for k, v in os.environ.items() if STARTED_WITH.get(k) != v and k not in STARTED_WITH}
# The variables the imported libraries may have read at import: the ML stack's own and the process basics. A run
# whose value of any of them differs from the server's starts cold; every other variable (a test runner's, a
# terminal's, memtune's own MEMTUNE_*, read when needed) is simply the run's, set before the run starts.
READ_AT_IMPORT_PREFIXES = ("HF_", "HUGGINGFACE", "TRANSFORMERS_", "TORCH", "PYTORCH_", "CUDA", "NVIDIA_", "NCCL_",
                           "OMP_", "MKL_", "KMP_", "OPENBLAS_", "BNB_", "BITSANDBYTES", "TRITON", "TOKENIZERS_",
                           "DATASETS_", "SAFETENSORS", "ACCELERATE_", "PEFT_", "TRL_", "XDG_", "LC_", "PYTHON")
READ_AT_IMPORT = {"HOME", "TMPDIR", "TEMP", "TMP", "LANG", "LANGUAGE", "PATH", "LD_LIBRARY_PATH", "LD_PRELOAD"}
# ... less what the job manager sets per run and the server's own fork-safe CUDA check
IGNORED = {"PYTHONUNBUFFERED", "PYTHONPATH", "PYTORCH_NVML_BASED_CUDA_CHECK", "OMP_NUM_THREADS"}


def _threads() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:  # not Linux: no fork server either
        return 0


# Threads the imports leave (torch's and pyarrow's allocator helpers; never Python threads). They are the ones any
# forked DataLoader worker meets too; a thread started later, by anything, makes the server unsafe to fork.
SAFE_THREADS = _threads()
CUDA_STARTED = torch.cuda.is_initialized()
BITSANDBYTES_AS_COLD = _bitsandbytes_as_cold()


def differs(env: dict[str, str]) -> list[str]:
    """The variables of a run's environment that the libraries may have read differently at import."""
    keys = {k for k in set(env) | set(STARTED_WITH) if k in READ_AT_IMPORT or k.startswith(READ_AT_IMPORT_PREFIXES)}
    return sorted(k for k in keys - IGNORED if env.get(k) != STARTED_WITH.get(k))


def fork_safe(env: dict[str, str]) -> str:
    """'' if a run with environment `env` may train in a process forked from here; else why not."""
    if CUDA_STARTED or torch.cuda.is_initialized():
        return "CUDA was initialized in the fork server"
    if not BITSANDBYTES_AS_COLD:
        return "bitsandbytes did not load its CUDA library in the fork server"
    if _threads() > SAFE_THREADS:
        return f"the fork server runs {_threads()} threads"
    changed = differs(env)
    if changed:
        return "the run's environment differs from the fork server's: " + ", ".join(changed[:5])
    return ""
