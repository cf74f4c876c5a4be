"""Turning a TrainConfig into a tokenizer, a (quantized) model and a LoRA-wrapped model.

`build_bnb_config` and `prepare_for_training` build the library objects from core/config/arguments.py's keyword dicts (the one
config -> library mapping, which "Show code" writes into its script too). `load_model` and `prepare_for_training`
do the heavy work, and `load_for_training` runs both for the recipe and says what it loaded; the levers with
modules of their own (the input embedding in CPU memory, the 4-bit output head) are core/levers/.
"""

from __future__ import annotations

import gc
import os
import sys
from pathlib import Path
from typing import Any, Protocol

import torch

from core.config import arguments as recipe
from core.hub import hf_token  # the loader passes it on (core/hub.py)
from core.config.settings import DEMO_MODEL, DEMO_VISION_MODEL, MOVES_BASE, ConfigError, Problem
from core.config.slices import DataSlice, Loading, ModelSlice, PlaceSlice, TrainerSlice
from core.levers import expert_store, experts as moe, variants
from core.levers.embedding import CpuEmbedding, load_embedding_on_cpu, offload_input_embeddings
from core.levers.output_head import quantize_output_head
from core.levers.stream_layers import attach as stream_frozen_layers, give_back_freed, streamed_parameters
from core.model.attention import use_varlen_attention
from core.model import lora_targets as lt
from core.model import vision
from core.model.compile import compile_layers, compiles
from core.model.nf4_cpu import keep_4bit_layout
from core.messages import Keyed, Said, keyed, words_of
from core.runs.events import EventSink, make_event


class _Placed(ModelSlice, PlaceSlice, Protocol):
    """The weights as this process loads them: which, how, and whether FSDP shards them."""


class _Prepared(Loading, TrainerSlice, Protocol):
    """The model made ready to train: its weights, the adapter, and the step's levers (checkpointing, the seed)."""


class _Trained(Loading, TrainerSlice, PlaceSlice, Protocol):
    """Loaded and prepared: the weights as this process loads them and the model ready to train."""


class ModelError(Keyed, RuntimeError):
    """A model could not be found or loaded; the message says why and what to do (a `model.err.*` locale key and
    its parameters, core.messages.Keyed: str() is en.json's text)."""

    def __init__(self, key: str, **params: Any) -> None:
        super().__init__(self._keyed(key, params))


def use_cuda(cfg: ModelSlice) -> bool:
    return cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available())


def build_bnb_config(cfg: _Placed):
    """The chapter's BitsAndBytesConfig (NF4, double quant, bf16 compute), or None without 4-bit."""
    kwargs = recipe.bnb_kwargs(cfg)
    if kwargs is None:
        return None
    from transformers import BitsAndBytesConfig

    return BitsAndBytesConfig(**kwargs)


def skeleton(cfg: ModelSlice, path: str):
    """The model at `path` as a module tree on the meta device (no weights, no memory: core/model/lora_targets.py),
    built once per run: what LoRA targets (lora_targets) and what the model can train exactly (core.model.resolve)
    are read from it. A model that is no causal LM (an encoder, seq2seq) is refused by name."""
    try:
        return lt.skeleton(path, cfg.trust_remote_code)
    except ValueError as exc:
        if "Unrecognized configuration class" not in str(exc):
            raise
        raise ModelError("model.err.not_causal", model=cfg.model) from None


def lora_targets(cfg: Loading, path: str | None = None, model=None):
    """cfg.lora_target_modules resolved against the model's linear layers (core/model/lora_targets.py): from `model`
    (loaded, or its skeleton), or from the skeleton of the model at `path`. A name the model lacks is a ConfigError
    that lists the model's real linear layers."""
    if model is None:
        model = skeleton(cfg, path or resolve_model_path(cfg))
    try:
        found = lt.resolve(list(cfg.lora_target_modules), lt.adaptable_layers(model, cfg.lora_vision), cfg.lora_r)
    except lt.TargetError as exc:
        raise ConfigError([Problem.of("lora_target_modules", "problem.lora_targets", modules=", ".join(exc.missing),
                                      model=cfg.model, linear=", ".join(exc.linear))]) from None
    found.model_type = getattr(getattr(model, "config", None), "model_type", None)
    refuse_lora_experts(cfg, model)
    return found


def refuse_lora_experts(cfg: Loading, model) -> None:
    """lora_experts refused by name where it cannot adapt this model's experts (core/levers/expert_store.py
    lora_problem), from the module tree before any weight loads; nothing without lora_experts."""
    why = expert_store.lora_problem(model) if cfg.lora_experts else None
    if why is None:
        return
    kind, classes = why
    raise ConfigError([Problem.of("lora_experts", "problem.lora_experts_family", model=cfg.model, classes=classes)
                       if kind == "family" else
                       Problem.of("lora_experts", "problem.lora_experts_dense", model=cfg.model)])


def resolve_model_path(cfg: ModelSlice, sink: EventSink | None = None) -> str:
    """A local folder holding the model: the demo, a user folder, or the Hub snapshot (downloaded if needed)."""
    from core.runs.public import model_problem

    if (why := model_problem(cfg)):  # public mode: no local folders, no remote code (Preview comes here too)
        raise ModelError("model.err.public", why=why)
    if cfg.model == DEMO_MODEL:
        from core.demo import ensure_demo_model

        return str(ensure_demo_model())
    if cfg.model == DEMO_VISION_MODEL:
        from core.demo_vision import ensure_tiny_model

        return str(ensure_tiny_model())
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


def is_vision_model(cfg: ModelSlice, path: str) -> bool:
    """An image-text-to-text model (core/model/vision.py), from its config.json."""
    from transformers import AutoConfig

    return vision.is_vision_config(AutoConfig.from_pretrained(path, trust_remote_code=cfg.trust_remote_code))


class _Processed(ModelSlice, DataSlice, Protocol):
    """The model's processor and the image budget its resizing keeps to."""


def load_processor(cfg: _Processed, path: str):
    """An image-text model's processor (its tokenizer and image processor), its image budget (image_max_pixels)
    applied, pad token set as load_tokenizer does."""
    return vision.load_processor(path, cfg.trust_remote_code, cfg.image_max_pixels)


def load_tokenizer(cfg: ModelSlice, path: str | None = None):
    from transformers import AutoTokenizer

    path = path or resolve_model_path(cfg)
    tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=cfg.trust_remote_code, token=hf_token())
    if tokenizer.pad_token is None:
        # The chapter sets pad = eos; padded positions carry no loss, so this is safe for training.
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_model(cfg: _Placed, path: str | None = None):
    """Load the base model, quantized to 4 bits when the config asks for it."""
    from transformers import AutoModelForCausalLM

    path = path or resolve_model_path(cfg)
    configure_cuda(cfg)
    # stream_layers: the whole model loads (4-bit) into CPU memory, so the GPU never holds it; the layers' frozen
    # weights stay there and the rest goes to the GPU when they are streamed (prepare_for_training)
    gpu = torch.cuda.current_device() if use_cuda(cfg) and not cfg.stream_layers else None
    kwargs = dict(quantization_config=build_bnb_config(cfg), token=hf_token(), **recipe.load_kwargs(cfg, gpu))
    try:
        model, failed = None, False
        if cfg.offload_embeddings and gpu is not None:
            try:
                with moe.while_loading(cfg, path):  # MoE experts quantized as they load (core/levers/experts.py)
                    model = load_embedding_on_cpu(path, cfg, kwargs)
            except Exception as exc:  # noqa: BLE001 - a model or library this path does not know: load as before
                if "trust_remote_code" in str(exc):
                    raise
                print(f"[memtune] loading the embedding straight to CPU memory failed ({type(exc).__name__}: "
                      f"{exc}); loading it on the GPU and moving it afterwards", file=sys.stderr, flush=True)
                failed = True
        if model is None:
            if failed:  # the failed first load's copy (a whole 8B) goes before the second one
                gc.collect()
                torch.cuda.empty_cache()
            if is_vision_model(cfg, path):  # image-text: the vision side unquantized and 16-bit
                if kwargs["quantization_config"] is not None:
                    kwargs["quantization_config"].llm_int8_skip_modules = vision.skip_modules(skeleton(cfg, path))
                model = vision.load(path, kwargs)
            else:
                with moe.while_loading(cfg, path):
                    model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
    except ValueError as exc:
        if "trust_remote_code" in str(exc):
            raise ModelError("model.err.remote_code", model=cfg.model) from None
        raise
    model.config.use_cache = False  # the KV cache is useless in training and warns with checkpointing
    model.memtune_moe_notes = moe.finish(model)  # the log's words on the experts and their routing loss
    keep_4bit_layout(model)
    name_backbone(model)
    if cfg.stream_layers:  # the loader's freed 16-bit copies go back before the layers' host copies are made
        give_back_freed()
    return model


def name_backbone(model) -> None:
    """TRL's fused loss head runs the backbone that `base_model_prefix` names (PreTrainedModel.base_model). Llama-4's
    text model inherits "language_model" (the multimodal model's attribute) while its backbone is `model`, so the
    head got the whole model's output: this instance names its own backbone (the class and its checkpoints keep
    theirs)."""
    from transformers import PreTrainedModel

    prefix = getattr(model, "base_model_prefix", "")
    backbone = getattr(model, "model", None)
    if prefix and getattr(model, prefix, None) is None and isinstance(backbone, PreTrainedModel):
        model.base_model_prefix = "model"


def prepare_for_training(model, cfg: _Prepared):
    """Freeze the base, apply the chapter's k-bit preparation (or memtune's lean variant) and wrap with LoRA."""
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training
    from transformers import set_seed

    # What LoRA adapts, read from the model as loaded (the steps below swap no decoder-block layer): the leaf names
    # this model has, what adapter_config.json then lists; lora_experts: the experts' 3-D weights too (peft's
    # target_parameters; core/levers/experts.py). Then the library arguments, once.
    targets = lora_targets(cfg, model=model)
    experts = moe.lora_parameters(model, cfg) if cfg.lora_experts else []
    # 4-bit experts hold no 3-D parameter for peft to wrap: their LoRA is memtune's own (core/levers/expert_lora.py)
    on_4bit = bool(experts) and moe.quantized(model)
    images = vision.is_vision_config(model.config)
    exclude = vision.exclude_pattern(model, cfg.lora_vision) if images else None
    kbit = recipe.kbit_kwargs(cfg)
    lora = recipe.lora_kwargs(cfg, list(targets.modules), [] if on_4bit else experts, exclude)
    if kbit is not None:
        # The chapter's recipe: peft upcasts every non-quantized parameter (embeddings, norms, lm_head) to fp32.
        # Checkpointing itself is left to the Trainer (SFTConfig), which enables it with our kwargs.
        model = prepare_model_for_kbit_training(model, **kbit)
        if images:
            vision.keep_vision_dtype(model, getattr(torch, recipe.dtype_name(cfg)))
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
        use_varlen_attention(model)  # per packed row on CUDA; elsewhere SDPA with a row mask (same results)
    # LoRA's A matrices start random: seed them, or two runs of one seeded config differ from the second step on
    # (the Trainer seeds only later, when it is built).
    set_seed(cfg.seed)
    model = get_peft_model(model, LoraConfig(**lora))
    if on_4bit:  # after peft, which would freeze them; seeded like peft's own matrices
        from core.levers import expert_lora  # peft's tuner layer: imported where LoRA is made

        expert_lora.attach(model, cfg.lora_r, cfg.lora_alpha, cfg.lora_dropout, cfg.use_rslora,
                           lora["init_lora_weights"])
    if cfg.lora_init in MOVES_BASE:  # PiSSA/OLoRA: the start, for the conversion on save
        variants.keep_initial(model)
    if compiles(cfg):
        # After peft, so each compiled layer holds its LoRA layers; lazily: the first step compiles.
        model.memtune_compile_note = compile_layers(model)
    if cfg.stream_layers:
        stream_layers(model, cfg)
    return model


def stream_layers(model, cfg: ModelSlice) -> None:
    """stream_layers (core/levers/stream_layers.py), last: LoRA's weights exist and train, so what streams is
    exactly the frozen part of each decoder layer. On CUDA everything else moves to the GPU (the model was loaded
    into CPU memory), an offloaded input embedding included as the place its rows go to."""
    device = torch.device("cuda", torch.cuda.current_device()) if use_cuda(cfg) else torch.device("cpu")
    stream_frozen_layers(model, device)
    emb = model.get_input_embeddings()
    if isinstance(emb, CpuEmbedding):
        emb.target_device = device
    if device.type == "cuda":
        model.base_model.model.hf_device_map = {"": device.index}  # one device now, as a one-GPU load says


def load_for_training(cfg: _Trained, path: str, emit: EventSink, cpu_eval: bool) -> tuple[Any, int, bool]:
    """The model loaded (quantized), prepared and wrapped with LoRA, and what the log says of it (LoRA's share, MoE
    experts, compile): (model, trainable parameters, whether its layers compile in the first step). `cpu_eval`:
    evals on the CPU come between training steps."""
    model = load_model(cfg, path)
    model = prepare_for_training(model, cfg)
    trainable, total = trainable_parameters(model)
    for note in getattr(model, "memtune_moe_notes", ()):  # MoE: experts stored, routing loss, LoRA on experts
        emit(make_event("log", level="info", **keyed(f"log.moe.{note.name}", **note.params)))
    emit(make_event("log", level="info", **keyed("log.lora", n=trainable, total=total)))
    note = getattr(model, "memtune_compile_note", "")  # core/model/compile.py's words, as is
    if compiles(cfg):
        emit(make_event("log", level="info", **words_of(note)))
    if cpu_eval:
        # bitsandbytes on a CPU with AVX512-BF16 repacks a 4-bit weight for inference the first time it runs in eval
        # mode, and training then goes through a kernel without a backward (wrong gradients, silently): an eval must
        # leave training exactly as it was.
        for module in model.modules():
            if getattr(module, "support_avx512bf16_for_cpu", False):
                module.support_avx512bf16_for_cpu = False
    # compiling, by the note's key (compile_layers says log.compile_skipped when it cannot)
    return model, trainable, getattr(note, "key", "") in ("log.compile", "log.compile_varlen")


def load_with_adapter(cfg: _Placed, adapter_dir: str | Path, path: str | None = None):
    """Base model + a saved adapter, with the same dtype policy as in training, ready for inference.

    The model is loaded fresh on every call, so adapters never stack on a reused model.
    """
    from peft import LoraConfig, PeftModel, prepare_model_for_kbit_training

    model = load_model(cfg, path)
    kbit = recipe.kbit_kwargs(cfg)
    if kbit is not None:
        # Same fp32 norms/embeddings/head as the trained model had, so the logits match it.
        model = prepare_model_for_kbit_training(model, **kbit)
    config = LoraConfig.from_pretrained(str(adapter_dir))
    on_4bit = bool(config.target_parameters) and moe.quantized(model)
    if on_4bit:  # peft wraps 16-bit 3-D parameters only: the experts' LoRA goes on memtune's 4-bit experts
        config.target_parameters = None
    model = PeftModel.from_pretrained(model, str(adapter_dir), config=config)
    if on_4bit:
        from core.levers import expert_lora

        expert_lora.load_onto(model, adapter_dir, config)
    return model.eval()


# --- the CUDA allocator's and cuBLAS' levers, set before the model loads (bench/RESULTS.md measures each) ---------
def configure_cuda(cfg: ModelSlice) -> None:
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


def cublas_env(cfg: ModelSlice) -> dict[str, str]:
    """small_cublas_workspace: the environment torch sizes cuBLAS' and cuBLASLt's workspaces by (4 MiB and 1 MiB
    instead of 32 MiB each on Hopper): the last ~0.2 GiB of a small card (measured: bench/RESULTS.md, section
    "The 7B shape at <= 5.0 GiB")."""
    return dict(SMALL_CUBLAS_WORKSPACE) if cfg.small_cublas_workspace else {}


def trainable_parameters(model) -> tuple[int, int]:
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters()) + streamed_parameters(model)  # in host memory now
    return trainable, total
