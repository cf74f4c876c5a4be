"""One real-size OLMoE-1B-7B experts layer in 4 bits on a GPU: what it holds after forward, and its forward and
backward peaks above where it started, one expert at a time against grouped products (core/levers/experts.py), at
1,024 and 4,096 tokens, each pair twice (the first warms the allocator). One JSON line per measurement.

    python3 -m bench.experts_memory        # on the GPU machine, after the wheels (bench/RESULTS.md run 26, call c)
"""
import json
import tempfile
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from bench.archs import hf_config
from core.config.settings import demo_config
from core.levers import experts as moe
from core.model.load import load_model

MiB = 2**20


def experts_layer():
    """The experts module of a one-layer OLMoE-1B-7B (its real widths), loaded in 4 bits by memtune's loader."""
    config = hf_config("olmoe-1b-7b")
    config.num_hidden_layers, config.vocab_size = 1, 1024
    folder = Path(tempfile.mkdtemp()) / "olmoe1"
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).save_pretrained(folder)
    cfg = demo_config(model=str(folder), load_in_4bit=True, upcast_to_fp32=False, precision="bf16", device="cuda",
                      offload_embeddings=False, quantize_output_head=False)
    model = load_model(cfg, str(folder))
    return model, model.model.layers[0].mlp.experts, config


def measure(model, experts, config, impl: str, tokens: int) -> dict:
    model.set_experts_implementation(impl)
    g = torch.Generator(device="cuda").manual_seed(tokens)
    hidden = torch.randn(tokens, config.hidden_size, dtype=torch.bfloat16, device="cuda", generator=g)
    hidden.requires_grad_()
    weights, index = torch.topk(torch.randn(tokens, config.num_experts, device="cuda", generator=g).softmax(-1),
                                config.num_experts_per_tok, dim=-1)
    weights = weights.to(torch.bfloat16).requires_grad_()
    grad = torch.randn(tokens, config.hidden_size, dtype=torch.bfloat16, device="cuda", generator=g)
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    saved = []

    def pack(t):
        saved.append(t.numel() * t.element_size())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = experts(hidden, index, weights)
    torch.cuda.synchronize()
    held, forward_peak = torch.cuda.memory_allocated() - base, torch.cuda.max_memory_allocated() - base
    torch.cuda.reset_peak_memory_stats()
    out.backward(grad)
    torch.cuda.synchronize()
    backward_peak = torch.cuda.max_memory_allocated() - base
    return {"tokens": tokens, "impl": impl, "held_MiB": round(held / MiB, 1),
            "fwd_peak_MiB": round(forward_peak / MiB, 1), "bwd_peak_MiB": round(backward_peak / MiB, 1),
            "saved_MiB": round(sum(saved) / MiB, 1), "n_saved": len(saved)}


def main() -> None:
    model, experts, config = experts_layer()
    for tokens in (1024, 4096):
        for impl in (moe.LOOP, moe.GROUPED, moe.LOOP, moe.GROUPED):
            print(json.dumps(measure(model, experts, config, impl, tokens)), flush=True)


if __name__ == "__main__":
    main()
