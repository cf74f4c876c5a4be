"""K-quant GGUF files (Q4_K_M, Q5_K_M, Q6_K) written by llama.cpp's own quantizer, `llama_model_quantize` in
libllama, called through ctypes on memtune's own F16 file: the mix of types per tensor is llama.cpp's, not ours.

The library comes from node-llama-cpp's prebuilt CPU package for this system, which scripts/install.sh installs with
npm where node is present (scripts/quantizer, pinned by its package-lock.json; npm picks the one for Linux, macOS or
Windows), or the tests' copy (tests/llama/node_modules), or from MEMTUNE_LLAMA_LIB (libllama's path, or its folder). The
quantizer's settings struct changes between llama.cpp releases, so the library's own defaults are read back and
checked against the layout below (llama.h of LLAMA_RELEASE) before anything is quantized.

A k-quant stores rows in blocks of 256 values; llama.cpp writes a tensor whose rows are not a multiple of 256 in
a 32-value type instead (Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0, else F16): `quantize` reads the written file
back and says which tensors that happened to.
"""

from __future__ import annotations

import ctypes
import os
import platform
import re
import sys
import threading
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from core.export.gguf import KQUANTS, GGUFError, tensor_nbytes
from core.messages import Said

ENV = "MEMTUNE_LLAMA_LIB"
LLAMA_RELEASE = "v0.4.0"  # the llama.cpp whose include/llama.h the struct below copies
ROOT = Path(__file__).resolve().parents[2]
NODE_MODULES = ROOT / "scripts" / "quantizer" / "node_modules"  # what scripts/install.sh installs
TEST_NODE_MODULES = ROOT / "tests" / "llama" / "node_modules"  # the tests' llama.cpp: the same prebuilt build
INSTALL = "cd scripts/quantizer && npm ci"  # needs Node.js 20+ (nodejs.org); scripts/install.sh runs it
BLOCK = 256  # values per k-quant block (QK_K)
# llama.h's enum llama_ftype
FTYPES = {"q4_k_m": 15, "q5_k_m": 17, "q6_k": 18}
DEFAULT_FTYPE = 7  # LLAMA_FTYPE_MOSTLY_Q8_0: what llama_model_quantize_default_params() sets
# The types llama.cpp's mix puts in each format's weight matrices when the rows fit (llama-quant.cpp: attn_v,
# ffn_down and output get more bits); anything else in a file is a fallback.
MIX = {"q4_k_m": {"Q4_K", "Q5_K", "Q6_K"}, "q5_k_m": {"Q5_K", "Q6_K"}, "q6_k": {"Q6_K"}}
# llama.cpp's fallback for rows that are not a multiple of 256 (tensor_type_fallback)
FALLBACK = {"Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0"}
_LOG = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)
_lock = threading.Lock()  # llama_log_set is global to the process


class QuantizeParams(ctypes.Structure):
    """struct llama_model_quantize_params (include/llama.h of LLAMA_RELEASE)."""

    _fields_ = [("nthread", ctypes.c_int32), ("ftype", ctypes.c_int), ("output_tensor_type", ctypes.c_int),
                ("token_embedding_type", ctypes.c_int), ("allow_requantize", ctypes.c_bool),
                ("quantize_output_tensor", ctypes.c_bool), ("only_copy", ctypes.c_bool), ("pure", ctypes.c_bool),
                ("keep_split", ctypes.c_bool), ("dry_run", ctypes.c_bool), ("imatrix", ctypes.c_void_p),
                ("kv_overrides", ctypes.c_void_p), ("tt_overrides", ctypes.c_void_p),
                ("prune_layers", ctypes.c_void_p), ("max_buf_size", ctypes.c_size_t)]


def _platform_prefix() -> str:
    """node-llama-cpp's package name prefix for this machine: linux-x64, mac-arm64, win-x64..."""
    system = {"linux": "linux", "darwin": "mac", "win32": "win"}.get(sys.platform, sys.platform)
    machine = platform.machine().lower()
    arch = {"x86_64": "x64", "amd64": "x64", "aarch64": "arm64", "arm64": "arm64"}.get(machine, machine)
    return f"{system}-{arch}"


def _library_in(folder: Path) -> Path | None:
    for pattern in ("libllama*.so", "libllama*.dylib", "llama*.dll"):
        found = sorted(p for p in folder.glob(pattern) if "common" not in p.name)
        if found:
            return found[0]
    return None


def _prebuilt(node_modules: Path) -> list[Path]:
    """node-llama-cpp's prebuilt folders for this machine, the plain CPU build first (a CUDA or Vulkan build loads
    the same quantizer but may need drivers to load at all)."""
    prefix = _platform_prefix()
    folders = [p for p in (node_modules / "@node-llama-cpp").glob(f"{prefix}*/bins/*") if p.is_dir()]
    return sorted(folders, key=lambda p: (any(g in p.name for g in ("cuda", "vulkan")), p.name))


def kquant_library() -> tuple[Path | None, Said | None]:
    """(libllama's path, None), or (None, why): a keyed reason when no usable library is found."""
    given = os.environ.get(ENV)
    if given:
        path = Path(given)
        lib = _library_in(path) if path.is_dir() else path if path.is_file() else None
        if lib is None:
            return None, Said("gguf.kquant.env_missing", path=given)
        candidates = [lib]
    else:
        candidates = [lib for modules in (NODE_MODULES, TEST_NODE_MODULES) for folder in _prebuilt(modules)
                      if (lib := _library_in(folder))]
        if not candidates:
            return None, Said("gguf.kquant.no_library", install=INSTALL)
    lib = candidates[0]
    why = _load(str(lib))[1]
    return (None, why) if why is not None else (lib, None)


@cache
def _load(path: str) -> tuple[ctypes.CDLL | None, Said | None]:
    """The library with its functions typed, after checking its default settings read back as this layout's."""
    if hasattr(os, "add_dll_directory"):  # Windows: llama.dll's ggml DLLs sit beside it
        os.add_dll_directory(str(Path(path).parent))
    try:
        lib = ctypes.CDLL(path)
        lib.llama_model_quantize_default_params.restype = QuantizeParams
        lib.llama_model_quantize.restype = ctypes.c_uint32
        lib.llama_model_quantize.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.POINTER(QuantizeParams)]
        lib.llama_log_set.argtypes = [_LOG, ctypes.c_void_p]
        lib.llama_backend_init()
    except (OSError, AttributeError) as exc:
        return None, Said("gguf.kquant.load_failed", path=path, error=str(exc))
    if not defaults_sane(lib.llama_model_quantize_default_params()):
        return None, Said("gguf.kquant.layout", path=path, release=LLAMA_RELEASE)
    return lib, None


def defaults_sane(p: QuantizeParams) -> bool:
    """Whether llama_model_quantize_default_params() filled the struct as LLAMA_RELEASE does: a struct of another
    layout shows up as shifted or garbage fields (the 8 GiB buffer size is the last field)."""
    flags = (p.allow_requantize, p.only_copy, p.pure, p.keep_split, p.dry_run)
    pointers = (p.imatrix, p.kv_overrides, p.tt_overrides, p.prune_layers)
    return (p.nthread == 0 and p.ftype == DEFAULT_FTYPE and p.quantize_output_tensor and not any(flags)
            and not any(pointers) and p.output_tensor_type == p.token_embedding_type  # both GGML_TYPE_COUNT
            and 30 < p.output_tensor_type < 100 and p.max_buf_size == 8 * 2**30)


@dataclass
class Quantized:
    path: Path
    types: dict[str, str]  # tensor name -> GGML type as written
    fallback: dict[str, str] = field(default_factory=dict)  # weight matrices llama.cpp wrote outside the mix
    note: Said | None = None  # what llama.cpp did with them, said


def quantize(f16_gguf: Path, out: Path, kind: str, threads: int = 0) -> Quantized:
    """Write `out` in k-quant `kind` (q4_k_m, q5_k_m, q6_k) from memtune's F16 GGUF with llama.cpp's quantizer;
    GGUFError (keyed) when the library is missing or the quantizer fails. threads 0: llama.cpp's default (every
    core)."""
    path, why = kquant_library()
    if path is None:
        raise GGUFError("gguf.err.kquant_missing", formats=kind, why=why)
    lib = _load(str(path))[0]
    params = lib.llama_model_quantize_default_params()
    params.ftype, params.nthread = FTYPES[kind], threads
    log: list[str] = []
    callback = _LOG(lambda level, text, _: log.append((text or b"").decode("utf-8", "replace")))
    out = Path(out)
    with _lock:
        lib.llama_log_set(callback, None)  # the quantizer's per-tensor log would flood the console
        try:
            rc = lib.llama_model_quantize(str(f16_gguf).encode(), str(out).encode(), ctypes.byref(params))
        finally:
            lib.llama_log_set(_LOG(), None)  # back to llama.cpp's own logger
    if rc != 0 or not out.is_file():
        errors = [line.strip() for line in "".join(log).splitlines() if "error" in line.lower() or "failed" in line]
        raise GGUFError("gguf.kquant.failed", file=out.name, log=" ".join(errors[-3:]) or f"code {rc}")
    return read_back(out, kind)


def read_back(path: Path, kind: str) -> Quantized:
    """The tensor types of a written k-quant file and the weight matrices outside `kind`'s mix (fallbacks)."""
    import gguf

    reader = gguf.GGUFReader(str(path))
    types = {t.name: t.tensor_type.name for t in reader.tensors}
    matrices = [t.name for t in reader.tensors if len([d for d in t.shape if d > 1]) >= 2]
    fallback = {name: types[name] for name in matrices if types[name] not in MIX[kind]}
    note = None
    if fallback:
        counts: dict[str, int] = {}
        for t in fallback.values():
            counts[t] = counts.get(t, 0) + 1
        note = Said("gguf.kquant.fallback", file=path.name, n=len(fallback), total=len(matrices), block=BLOCK,
                    type=KQUANTS[kind][0], types=", ".join(f"{t} ({n})" for t, n in sorted(counts.items())))
    return Quantized(path=path, types=types, fallback=fallback, note=note)


# --- the plan's size estimate: llama.cpp's mix for the common tensors, before any file exists ----------------------
def _more_bits(i: int, n: int) -> bool:
    """llama-quant.cpp's use_more_bits: the layers whose attn_v and ffn_down get Q6_K in Q4_K_M and Q5_K_M."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def planned_type(kind: str, name: str, shape: list[int], n_layers: int, tied: bool) -> str:
    """The GGML type llama.cpp's mix gives a tensor of memtune's plan in `kind` (for the plan's size: the file's
    own types come from llama.cpp)."""
    base = KQUANTS[kind][0]
    if len(shape) < 2 or name == "rope_freqs.weight":
        return "F32"
    wanted = base
    layer = re.match(r"blk\.(\d+)\.", name)
    if name == "output.weight" or (tied and name == "token_embd.weight"):
        wanted = "Q6_K"
    elif kind in ("q4_k_m", "q5_k_m") and layer and re.search(r"attn_v\.|ffn_down\.", name) \
            and _more_bits(int(layer.group(1)), n_layers):
        wanted = "Q6_K"
    elif "attn_qkv." in name and kind in ("q4_k_m", "q5_k_m"):
        wanted = {"q4_k_m": "Q5_K", "q5_k_m": "Q6_K"}[kind]
    if shape[-1] % BLOCK:
        wanted = FALLBACK[wanted]
        if shape[-1] % 32:
            wanted = "F16"
    return wanted


def planned_bytes(plan: list[tuple[str, str | None, list[int]]], kind: str, n_layers: int) -> int:
    """Bytes of the tensors' data in `kind`, each padded to the file's 32-byte alignment."""
    tied = not any(name == "output.weight" for name, _, _ in plan)
    return sum(-(-tensor_nbytes(planned_type(kind, name, shape, n_layers, tied), shape) // 32) * 32
               for name, _, shape in plan)
