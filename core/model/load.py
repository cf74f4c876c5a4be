"""Turning a TrainConfig into a tokenizer, a (quantized) model and a LoRA-wrapped model.

`build_bnb_config` and `build_lora_config` build the library objects from core/config/arguments.py's keyword dicts (the one
config -> library mapping, which "Show code" writes into its script too). `load_model` and `prepare_for_training`
do the heavy work.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import torch

from core.config import arguments as recipe
from core.config.settings import DEMO_MODEL, TrainConfig
from core.messages import Keyed, Said, keyed
from core.runs.events import EventSink, make_event


class ModelError(Keyed, RuntimeError):
    """A model could not be found or loaded; the message says why and what to do (a `model.err.*` locale key and
    its parameters, core.messages.Keyed: str() is en.json's text)."""

    def __init__(self, key: str, **params: Any) -> None:
        super().__init__(self._keyed(key, params))


def use_cuda(cfg: TrainConfig) -> bool:
    return cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available())


def build_bnb_config(cfg: TrainConfig):
    """The chapter's BitsAndBytesConfig (NF4, double quant, bf16 compute), or None without 4-bit."""
    kwargs = recipe.bnb_kwargs(cfg)
    if kwargs is None:
        return None
    from transformers import BitsAndBytesConfig

    return BitsAndBytesConfig(**kwargs)


def build_lora_config(cfg: TrainConfig, modules: list[str] | None = None):
    """peft's LoraConfig; `modules`: the resolved leaf names (lora_targets), else the config's names as written."""
    from peft import LoraConfig

    return LoraConfig(**recipe.lora_kwargs(cfg, modules))


def lora_targets(cfg: TrainConfig, path: str | None = None, model=None):
    """cfg.lora_target_modules resolved against the model's linear layers (core/model/lora_targets.py): from `model`'s
    tree, or from the module tree of the model at `path` built on the meta device (before any weight loads). A name
    the model lacks is a ConfigError that lists the model's real linear layers."""
    from core.model import lora_targets as lt
    from core.config.settings import ConfigError, Problem

    try:
        if model is not None:
            return lt.resolve(cfg.lora_target_modules, lt.linear_layers(model), cfg.lora_r)
        return lt.for_path(cfg.lora_target_modules, cfg.lora_r, path or resolve_model_path(cfg), cfg.trust_remote_code)
    except ValueError as exc:
        if "Unrecognized configuration class" not in str(exc) and not isinstance(exc, lt.TargetError):
            raise
        if not isinstance(exc, lt.TargetError):  # e.g. an encoder or seq2seq model: refused by name, up front
            raise ModelError("model.err.not_causal", model=cfg.model) from None
        raise ConfigError([Problem.of("lora_target_modules", "problem.lora_targets", modules=", ".join(exc.missing),
                                      model=cfg.model, linear=", ".join(exc.linear))]) from None


def hf_token() -> str | None:
    # Read from the environment only: never logged, never written to a config or run folder.
    return os.environ.get("HF_TOKEN") or os.environ.get("HUGGING_FACE_HUB_TOKEN") or None


def resolve_model_path(cfg: TrainConfig, sink: EventSink | None = None) -> str:
    """A local folder holding the model: the demo, a user folder, or the Hub snapshot (downloaded if needed)."""
    from core.runs.public import model_problem

    if (why := model_problem(cfg)):  # public mode: no local folders, no remote code (Preview comes here too)
        raise ModelError("model.err.public", why=why)
    if cfg.model == DEMO_MODEL:
        from core.demo import ensure_demo_model

        return str(ensure_demo_model())
    local = Path(cfg.model).expanduser()
    if local.exists():
        if not (local / "config.json").is_file():
            raise ModelError("model.err.no_config", path=local)
        return str(local)
    if cfg.model.startswith((".", "/", "~")) or cfg.model.count("/") > 1:
        raise ModelError("model.err.no_folder", path=cfg.model)
    return _download(cfg.model, sink)


def _download(repo_id: str, sink: EventSink | None) -> str:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (GatedRepoError, HFValidationError, LocalEntryNotFoundError,
                                        OfflineModeIsEnabled, RepositoryNotFoundError)
    from tqdm.auto import tqdm

    patterns = ["*.json", "*.safetensors", "*.model", "*.txt", "*.tiktoken", "*.jinja"]

    class EventTqdm(tqdm):  # forwards the Hub's download progress to the event sink
        def update(self, n=1):
            out = super().update(n)
            if sink is not None and self.total:
                sink(make_event("phase", phase="downloading", progress=min(1.0, self.n / self.total),
                                **keyed("log.phase.download_progress", repo=repo_id, done=self.n / 2**30,
                                        total=self.total / 2**30, unit=Said("unit.gib"))))
            return out

    try:
        # Cached files first, so a model already on disk never needs the network.
        return snapshot_download(repo_id, allow_patterns=patterns, local_files_only=True, token=hf_token())
    except (LocalEntryNotFoundError, OfflineModeIsEnabled, FileNotFoundError):
        pass
    except HFValidationError:
        raise ModelError("model.err.not_an_id", model=repr(repo_id)) from None
    try:
        if sink is not None:
            sink(make_event("phase", phase="downloading", progress=0.0, **keyed("log.phase.downloading", repo=repo_id)))
        return snapshot_download(repo_id, allow_patterns=patterns, token=hf_token(), tqdm_class=EventTqdm)
    except GatedRepoError:
        raise ModelError("model.err.gated", model=repo_id) from None
    except RepositoryNotFoundError:
        raise ModelError("model.err.not_on_hub" if hf_token() else "model.err.not_on_hub_token", model=repo_id) from None
    except (LocalEntryNotFoundError, OfflineModeIsEnabled, OSError) as exc:
        raise ModelError("model.err.offline", model=repo_id, error=type(exc).__name__) from None


def load_tokenizer(cfg: TrainConfig, path: str | None = None):
    from transformers import AutoTokenizer

    path = path or resolve_model_path(cfg)
    tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=cfg.trust_remote_code, token=hf_token())
    if tokenizer.pad_token is None:
        # The chapter sets pad = eos; padded positions carry no loss, so this is safe for training.
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_model(cfg: TrainConfig, path: str | None = None):
    """Load the base model, quantized to 4 bits when the config asks for it."""
    from transformers import AutoModelForCausalLM

    path = path or resolve_model_path(cfg)
    configure_cuda(cfg)
    kwargs = dict(quantization_config=build_bnb_config(cfg), token=hf_token(),
                  **recipe.load_kwargs(cfg, torch.cuda.current_device() if use_cuda(cfg) else None))
    try:
        model = None
        if cfg.offload_embeddings and use_cuda(cfg):
            try:
                model = _load_embedding_on_cpu(path, cfg, kwargs)
            except Exception as exc:  # noqa: BLE001 - a model or library this path does not know: load as before
                if "trust_remote_code" in str(exc):
                    raise
                print(f"[memtune] loading the embedding straight to CPU memory failed ({type(exc).__name__}: "
                      f"{exc}); loading it on the GPU and moving it afterwards", file=sys.stderr, flush=True)
                model = None
                torch.cuda.empty_cache()
        if model is None:
            model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
    except ValueError as exc:
        if "trust_remote_code" in str(exc):
            raise ModelError("model.err.remote_code", model=cfg.model) from None
        raise
    model.config.use_cache = False  # the KV cache is useless in training and warns with checkpointing
    return model


def _embedding_device_map(config: Any, cfg: TrainConfig, gpu: int) -> dict[str, Any] | None:
    """A device map that puts every module of the model `config` describes on `gpu` except the input embedding (on
    "cpu"); None where the embedding is tied to the output head or cannot be found (then nothing is offloaded)."""
    from transformers import AutoModelForCausalLM

    if getattr(config, "tie_word_embeddings", False) or getattr(config.get_text_config(), "tie_word_embeddings", False):
        return None
    with torch.device("meta"):  # the module tree only: no memory, ~1 s for 8B
        skeleton = AutoModelForCausalLM.from_config(config, trust_remote_code=cfg.trust_remote_code)
    target = skeleton.get_input_embeddings()
    name = next((n for n, m in skeleton.named_modules() if m is target), None)
    if not name:
        return None
    # Every child along the path to the embedding gets its own entry; everything else stays whole on the GPU.
    result: dict[str, Any] = {}
    module, prefix = skeleton, ""
    for part in name.split("."):
        for child_name, _ in module.named_children():
            full = prefix + child_name
            if child_name != part:
                result[full] = gpu
        for pname, _ in module.named_parameters(recurse=False):
            result[prefix + pname] = gpu
        module, prefix = getattr(module, part), prefix + part + "."
    result[name] = "cpu"
    head = skeleton.get_output_embeddings()
    head_name = next((n for n, m in skeleton.named_modules() if m is head), None) if cfg.quantize_output_head else None
    if head_name and head_name in result:  # a top-level head: loaded to CPU memory, quantized to the GPU in chunks
        result[head_name] = "cpu"
    return result


def offload_kwargs(config: Any, kwargs: dict[str, Any], dmap: dict[str, Any]) -> dict[str, Any]:
    """from_pretrained's keywords for a load with the input embedding on "cpu" in `dmap`; `config` is the
    checkpoint's (AutoConfig), changed in place where it is a 4-bit checkpoint's.

    bitsandbytes refuses a "cpu" entry unless told the CPU modules stay unquantized (the embedding always is). A
    checkpoint saved already in 4-bit (a "-bnb-4bit" repository) brings its own quantization config, and transformers
    then ignores the flag on the config passed in: it is set on the checkpoint's config instead."""
    kwargs = dict(kwargs, device_map=dmap)
    if kwargs.get("quantization_config") is None:
        return kwargs
    saved = getattr(config, "quantization_config", None)
    if saved is not None:
        saved = dict(saved) if isinstance(saved, dict) else saved.to_dict()
        config.quantization_config = {**saved, "llm_int8_enable_fp32_cpu_offload": True}
        kwargs["config"] = config
    kwargs["quantization_config"].llm_int8_enable_fp32_cpu_offload = True
    return kwargs


def _load_embedding_on_cpu(path: str, cfg: TrainConfig, kwargs: dict[str, Any]):
    """offload_embeddings: load the input embedding straight into CPU memory, so it never takes GPU memory (loading
    it on the GPU and moving it afterwards made loading the 8B peak: +1 GiB). None where it does not apply.

    transformers loads each weight to its device in the map and accelerate then hooks the "cpu" module to copy its
    weight to the GPU at every forward; removing the hooks puts the weight back in CPU memory, and CpuEmbedding
    (prepare_for_training) then looks rows up there. The model is then exactly what a one-device load gives.
    """
    from accelerate.hooks import remove_hook_from_module, remove_hook_from_submodules
    from transformers import AutoConfig, AutoModelForCausalLM

    gpu = torch.cuda.current_device()
    config = AutoConfig.from_pretrained(path, trust_remote_code=cfg.trust_remote_code, token=hf_token())
    dmap = _embedding_device_map(config, cfg, gpu)
    if dmap is None:
        return None
    model = AutoModelForCausalLM.from_pretrained(path, **offload_kwargs(config, kwargs, dmap))
    emb = model.get_input_embeddings()
    remove_hook_from_module(emb)  # the hook's detach puts the weight back on its original device: the CPU
    remove_hook_from_submodules(model)  # the other hooks only move inputs between devices that are now one
    for attr in ("to", "cuda"):  # accelerate's guards against moving a model with offloaded modules
        model.__dict__.pop(attr, None)
    if emb.weight.device.type != "cpu":
        raise RuntimeError(f"input embedding ended on {emb.weight.device}, expected the CPU")
    head = model.get_output_embeddings()
    if cfg.quantize_output_head and head is not None and head.weight.device.type == "meta":
        raise RuntimeError("output head ended on the meta device")
    emb.weight.requires_grad_(False)  # frozen in every memtune recipe; CpuEmbedding never trains it
    model.set_input_embeddings(CpuEmbedding(emb, torch.device("cuda", gpu)))  # model.device names the GPU again
    model.hf_device_map = {"": gpu}
    if model.config.quantization_config is not None and hasattr(model.config.quantization_config, "llm_int8_enable_fp32_cpu_offload"):
        model.config.quantization_config.llm_int8_enable_fp32_cpu_offload = False  # saved configs stay as asked
    return model


def prepare_for_training(model, cfg: TrainConfig):
    """Freeze the base, apply the chapter's k-bit preparation (or memtune's lean variant) and wrap with LoRA."""
    from peft import get_peft_model, prepare_model_for_kbit_training
    from transformers import set_seed

    kbit = recipe.kbit_kwargs(cfg)
    if kbit is not None:
        # The chapter's recipe: peft upcasts every non-quantized parameter (embeddings, norms, lm_head) to fp32.
        # Checkpointing itself is left to the Trainer (SFTConfig), which enables it with our kwargs.
        model = prepare_model_for_kbit_training(model, **kbit)
    else:
        # Lean: the frozen base stays in its loaded dtype; only the LoRA weights train (in fp32, via peft).
        for param in model.parameters():
            param.requires_grad_(False)
    if cfg.offload_embeddings:
        # After the upcast (if any), so the CPU copy has the dtype the chapter's recipe would compute with.
        emb = model.get_input_embeddings()
        if isinstance(emb, CpuEmbedding) and cfg.load_in_4bit and cfg.upcast_to_fp32:
            emb.cpu_embedding.float()  # loaded on the CPU already (hidden from the upcast): same fp32 rows
        offload_input_embeddings(model)
    if cfg.quantize_output_head and cfg.load_in_4bit:
        quantize_output_head(model, torch.device("cuda", torch.cuda.current_device()) if use_cuda(cfg) else None)
    if cfg.gradient_checkpointing:
        # Checkpointed blocks need an input that requires grad, or no gradient reaches the LoRA weights.
        model.enable_input_require_grads()
    if cfg.attention == "varlen":
        from core.model.attention import use_varlen_attention

        use_varlen_attention(model)  # per packed row on CUDA; elsewhere SDPA with a row mask (same results)
    # LoRA's A matrices start random: seed them, or two runs of one seeded config differ from the second step on
    # (the Trainer seeds only later, when it is built).
    set_seed(cfg.seed)
    targets = lora_targets(cfg, model=model)  # the leaf names this model has: what adapter_config.json then lists
    model = get_peft_model(model, build_lora_config(cfg, targets.modules))
    if cfg.compile_layers:
        from core.model.compile import compile_layers

        # After peft, so each compiled layer holds its LoRA layers; lazily: the first step compiles.
        model.memtune_compile_note = compile_layers(model)
    return model


def load_with_adapter(cfg: TrainConfig, adapter_dir: str | Path, path: str | None = None):
    """Base model + a saved adapter, with the same dtype policy as in training, ready for inference.

    The model is loaded fresh on every call, so adapters never stack on a reused model.
    """
    from peft import PeftModel, prepare_model_for_kbit_training

    model = load_model(cfg, path)
    kbit = recipe.kbit_kwargs(cfg)
    if kbit is not None:
        # Same fp32 norms/embeddings/head as the trained model had, so the logits match it.
        model = prepare_model_for_kbit_training(model, **kbit)
    model = PeftModel.from_pretrained(model, str(adapter_dir))
    return model.eval()


# --- memory levers (bench/RESULTS.md measures each) --------------------------------------------------------------
def configure_cuda(cfg: TrainConfig) -> None:
    """Process-wide CUDA allocator settings a config asks for; a no-op without CUDA.

    expandable_segments lets the caching allocator grow a segment in place instead of caching many fixed-size
    blocks, which cuts memory that is reserved but unused (fragmentation) and so the GPU peak. It applies to the
    segments allocated from now on, so it is set before the model is loaded.
    """
    if not use_cuda(cfg):
        return
    for name, value in cublas_env(cfg).items():  # read once, when torch makes its first cuBLAS handle: set now
        os.environ.setdefault(name, value)
    setting = f"expandable_segments:{bool(cfg.expandable_segments)}"
    setter = getattr(torch._C, "_accelerator_setAllocatorSettings", None) or torch.cuda.memory._set_allocator_settings
    try:
        setter(setting)
    except (AttributeError, RuntimeError):  # an older torch, or a platform without expandable segments
        pass


SMALL_CUBLAS_WORKSPACE = {"CUBLAS_WORKSPACE_CONFIG": ":4096:1", "CUBLASLT_WORKSPACE_SIZE": "1024"}  # KiB


def cublas_env(cfg: TrainConfig) -> dict[str, str]:
    """small_cublas_workspace: the environment torch sizes cuBLAS' and cuBLASLt's workspaces by (4 MiB and 1 MiB
    instead of 32 MiB each on Hopper). bench/RESULTS.md run 11: the Llama-2-7B shape's six_gb with activation
    offloading went from 5.08 to 4.90 GiB on the GPU."""
    return dict(SMALL_CUBLAS_WORKSPACE) if cfg.small_cublas_workspace else {}


class CpuEmbedding(torch.nn.Module):
    """A frozen input embedding kept in CPU memory: rows are looked up there and only they go to the GPU.

    The embedding matrix of a Llama-3 model is 128k x hidden (~1 GiB in bf16 at 8B, ~2 GiB at 70B), yet a batch
    reads only a few thousand rows of it and, frozen, it needs no gradient. The wrapped module is kept out of
    the module tree on purpose: `.to(device)` (Trainer/Accelerate placing the model) must not move it back, and
    `model.device` must keep naming the GPU. The output equals the GPU embedding's bit for bit.
    """

    def __init__(self, embedding: torch.nn.Module, device: torch.device):
        super().__init__()
        embedding.to("cpu")
        object.__setattr__(self, "cpu_embedding", embedding)  # not registered: invisible to .to()/parameters()
        self.target_device = torch.device(device)

    @property
    def weight(self) -> torch.Tensor:
        return self.cpu_embedding.weight

    @property
    def num_embeddings(self) -> int:
        return self.cpu_embedding.weight.shape[0]

    @property
    def embedding_dim(self) -> int:
        return self.cpu_embedding.weight.shape[1]

    @property
    def padding_idx(self):
        return getattr(self.cpu_embedding, "padding_idx", None)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():  # frozen: no graph on the CPU side
            rows = self.cpu_embedding(input_ids.to("cpu"))  # scaled embeddings (e.g. Gemma) keep their scale
        return rows.to(self.target_device, non_blocking=False)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, on cpu -> {self.target_device}"


HEAD_ROWS = 8192  # vocabulary rows per quantized block of the output head (and per chunk of TRL's fused head)


class NF4Rows(torch.Tensor):
    """A frozen [vocabulary, hidden] weight stored in 4-bit NF4, one block of HEAD_ROWS rows at a time.

    It stands in for the output head's weight where TRL's fused LM head (trl.kernels.chunked_logprob, which the
    SFTTrainer uses for the loss) reads it: that kernel only takes `weight[start:end]` slices, one vocabulary chunk
    at a time, and `weight[a:b]` dequantizes just those rows (a compute-dtype copy of one chunk). Shape, dtype and
    device are those of the bf16 weight; the tensor itself is an expanded one-element placeholder (no memory).
    Anything else than slicing rows (a full matmul, say) is refused, so nothing silently dequantizes everything.
    """

    @staticmethod
    def __new__(cls, blocks, rows: int, hidden: int, dtype: torch.dtype, device: torch.device):
        placeholder = torch.zeros(1, dtype=dtype, device=device).expand(rows, hidden)
        self = torch.Tensor._make_subclass(cls, placeholder, False)
        self.blocks = blocks  # [(first row, packed uint8, bitsandbytes QuantState)]
        return self

    def rows(self, start: int, stop: int) -> torch.Tensor:
        import bitsandbytes.functional as bnbf

        parts = []
        for first, packed, state in self.blocks:
            n = state.shape[0]
            a, b = max(start, first), min(stop, first + n)
            if a < b:
                block = bnbf.dequantize_4bit(packed, state)
                parts.append(block[a - first:b - first])
        out = parts[0] if len(parts) == 1 else torch.cat(parts)
        return out.to(self.dtype)

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.Tensor.__getitem__ and isinstance(args[0], NF4Rows):
            key = args[1]
            if isinstance(key, slice) and key.step in (None, 1):
                start, stop, _ = key.indices(args[0].shape[0])
                return args[0].rows(start, stop)
            raise TypeError("a 4-bit output head can only be read in row slices (weight[a:b])")
        if func in _NF4_REFUSED and any(isinstance(a, NF4Rows) for a in args):
            raise TypeError(f"{func.__name__} on a 4-bit output head: read it in row slices (weight[a:b])")
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **kwargs)


_NF4_REFUSED = {torch.nn.functional.linear, torch.matmul, torch.mm, torch.Tensor.__matmul__, torch.Tensor.t,
                torch.Tensor.float, torch.Tensor.contiguous, torch.Tensor.clone}


class QuantizedHead(torch.nn.Module):
    """The frozen output head in 4-bit NF4 (quantize_output_head): 0.25 GiB instead of 0.98 on Llama-3 8B.

    Training never calls it: TRL's fused LM head reads `weight` chunk by chunk (see NF4Rows). Called directly
    (generation, a plain forward), it computes the logits block by block, never holding the bf16 weight whole.
    """

    def __init__(self, weight: torch.Tensor, device: torch.device | None):
        super().__init__()
        import bitsandbytes.functional as bnbf

        rows, hidden = weight.shape
        target = device or weight.device
        blocks = []
        for first in range(0, rows, HEAD_ROWS):
            chunk = weight.data[first:first + HEAD_ROWS].to(target, torch.bfloat16 if weight.dtype == torch.float32
                                                                else weight.dtype)
            packed, state = bnbf.quantize_4bit(chunk, quant_type="nf4", compress_statistics=True)
            blocks.append((first, packed, state))
            del chunk
        object.__setattr__(self, "weight", NF4Rows(blocks, rows, hidden, weight.dtype if weight.dtype != torch.float32
                                                   else torch.bfloat16, target))
        self.bias = None
        self.in_features, self.out_features = hidden, rows

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        w = self.weight
        return torch.cat([hidden @ w[a:a + HEAD_ROWS].to(hidden.dtype).t() for a in range(0, w.shape[0], HEAD_ROWS)],
                         dim=-1)

    def extra_repr(self) -> str:
        return f"{self.in_features} -> {self.out_features}, 4-bit NF4 in blocks of {HEAD_ROWS} rows"


def quantize_output_head(model, device: torch.device | None) -> bool:
    """Replace the frozen output head with QuantizedHead (quantize_output_head). Returns whether it did.

    Skipped where the head shares the input embedding's matrix (tied weights). TRL's fused head is set to read
    HEAD_ROWS vocabulary rows per chunk (its default, 32k rows, would dequantize 0.25 GiB at a time on 8B).
    """
    head = model.get_output_embeddings()
    if head is None or isinstance(head, QuantizedHead) or embeddings_tied(model) or getattr(head, "bias", None) is not None:
        return False
    weight = head.weight
    model.set_output_embeddings(QuantizedHead(weight, device))
    del head, weight
    try:
        import trl.trainer.utils as trl_utils

        if hasattr(trl_utils, "_CHUNKED_LOGPROB_CHUNK_SIZE"):
            trl_utils._CHUNKED_LOGPROB_CHUNK_SIZE = HEAD_ROWS
    except ImportError:
        pass
    if device is not None and device.type == "cuda":
        torch.cuda.empty_cache()
    return True


def embeddings_tied(model) -> bool:
    inp, out = model.get_input_embeddings(), model.get_output_embeddings()
    if out is None or getattr(inp, "weight", None) is None or getattr(out, "weight", None) is None:
        return False
    return inp.weight is out.weight or inp.weight.data_ptr() == out.weight.data_ptr()


def offload_input_embeddings(model) -> bool:
    """Move the input embedding to CPU memory (see CpuEmbedding). Returns whether it did.

    Skipped where the output head shares the embedding's matrix (tied weights): the head needs it on the GPU
    every step, so nothing would be saved.
    """
    emb = model.get_input_embeddings()
    if isinstance(emb, CpuEmbedding):
        return True
    if emb is None or embeddings_tied(model):
        return False
    weight = getattr(emb, "weight", None)
    if weight is None or weight.requires_grad:
        return False  # a trained embedding must stay where the optimizer can update it
    device = weight.device
    model.set_input_embeddings(CpuEmbedding(emb, device))
    if device.type == "cuda":
        torch.cuda.empty_cache()  # hand the freed ~GiB back at once
    return True


def trainable_parameters(model) -> tuple[int, int]:
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())
    return trainable, total
