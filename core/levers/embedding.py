"""offload_embeddings: the frozen input embedding kept in CPU memory, only the rows a batch looks up sent to the GPU.

`load_embedding_on_cpu` loads it straight into CPU memory (core.model.load.load_model calls it on CUDA;
`embedding_device_map` and `offload_kwargs` build that load's device map and keywords); where the model was loaded
whole, `offload_input_embeddings` (core.model.load.prepare_for_training) moves it out afterwards. Either way the
model's input embedding becomes a `CpuEmbedding`. A tied embedding (the output head's matrix too) stays where it is.
"""

from __future__ import annotations

from typing import Any

import torch

from core.config.slices import ModelSlice
from core.levers.output_head import embeddings_tied  # a question about the head: is it the embedding's matrix?


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


def offload_input_embeddings(model) -> bool:
    """offload_embeddings on a model loaded whole: move its input embedding to CPU memory (see CpuEmbedding).
    Returns whether the embedding is there now.

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



def embedding_device_map(config: Any, cfg: ModelSlice, gpu: int) -> dict[str, Any] | None:
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


def load_embedding_on_cpu(path: str, cfg: ModelSlice, kwargs: dict[str, Any]):
    """offload_embeddings: load the input embedding straight into CPU memory, so it never takes GPU memory (loading
    it on the GPU and moving it afterwards made loading the 8B peak: +1 GiB). None where it does not apply.

    transformers loads each weight to its device in the map and accelerate then hooks the "cpu" module to copy its
    weight to the GPU at every forward; removing the hooks puts the weight back in CPU memory, and CpuEmbedding
    (prepare_for_training) then looks rows up there. The model is then exactly what a one-device load gives.
    """
    from accelerate.hooks import remove_hook_from_module, remove_hook_from_submodules
    from transformers import AutoConfig, AutoModelForCausalLM

    gpu = torch.cuda.current_device()
    config = AutoConfig.from_pretrained(path, trust_remote_code=cfg.trust_remote_code, token=kwargs.get("token"))
    dmap = embedding_device_map(config, cfg, gpu)
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
    saved_as_asked(model.config)
    return model


def saved_as_asked(config: Any) -> None:
    """Turn the CPU-offload flag offload_kwargs set back off, so the saved config says what the user asked. A 16-bit
    base has no quantization config at all: reading one there would fail and load the model a second time."""
    quant = getattr(config, "quantization_config", None)
    if quant is not None and hasattr(quant, "llm_int8_enable_fp32_cpu_offload"):
        quant.llm_int8_enable_fp32_cpu_offload = False
