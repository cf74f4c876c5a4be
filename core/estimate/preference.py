"""What TRL's ORPO loss holds per (token x vocab) element of the logits, measured on the CPU.

TRL's ORPOTrainer (trl/experimental/orpo/orpo_trainer.py) does not go through liger's fused loss nor TRL's chunked LM
head: `concatenated_forward` keeps the model's whole logits [2B, T, V]. They come out of the lm_head in the compute
dtype, and accelerate (Accelerator.prepare_model under bf16/fp16: autocast around the model's forward only,
`convert_outputs_to_fp32` on its outputs) hands them over as an fp32 copy; the Trainer's own autocast is a
nullcontext, so the loss runs in fp32. A shifted contiguous copy of the chosen half goes to `nn.CrossEntropyLoss`
(its fp32 log-softmax kept for backward) and `get_batch_logps` runs `selective_log_softmax` over all of it (on CUDA
with Triton: TRL's fused log-prob kernel, which keeps the logits and makes a logits-sized gradient in backward). The
backward then makes those gradients and the slices' zero-padded copies before they are summed into the logits'
gradient. Which of these coexist at the peak depends on autograd's order, so it is measured, not summed by hand: a
one-layer Llama of the compute dtype with two vocabulary sizes runs TRL's own `get_batch_loss_metrics`
(concatenated_forward + odds_ratio_loss) forward and backward, its forward wrapped as accelerate wraps it, under a
TorchDispatchMode that follows every new storage until it is freed; the peak's growth per added (row token x
vocab) element is the figure (12.0 bytes with torch 2.13 / TRL 1.16: fp32 logits, their gradient and a slice's
zero-padded copy). The input-side terms (layers, hidden states) do not grow with the vocabulary and cancel out.

Stood in for on the CPU: TRL's Triton kernel (`trl.kernels.selective_log_softmax_and_entropy`, which the CPU path
replaces with a per-row log_softmax loop): `_FusedLogProb` allocates what it allocates (four fp32 [rows, T] vectors
in forward, saving the logits; an `empty_like(logits)` gradient in backward), its arithmetic done outside the count.
CPU bf16 autocast stands in for CUDA's inside the model's forward (the loss itself runs without autocast).

Cost: two tiny forward/backward passes (well under a second); cached in this process and on disk with
core.estimate.measure's cache, keyed by dtype and the torch / transformers / TRL versions (the web server reads it
and never measures: core.estimate.measure.measuring_here).
"""

from __future__ import annotations

import contextlib
import functools

ROWS_PER_PAIR = 2
TOKENS = 32  # tokens per row of the measurement
VOCABS = (256, 512)  # the two vocabulary sizes whose difference is measured
MODEL_VERSION = 2  # 2: accelerate's fp32 outputs


class _Peak:
    """A TorchDispatchMode counting the bytes of storages created inside it while they live (views excluded)."""

    def __init__(self):
        from torch.utils._python_dispatch import TorchDispatchMode
        from torch.multiprocessing.reductions import StorageWeakRef

        peak = self

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                if not peak.paused:
                    peak.track(out, args, kwargs, StorageWeakRef)
                return out

        self.mode, self.live, self.now, self.peak, self.paused = Mode(), {}, 0, 0, False

    def track(self, out, args, kwargs, weak):
        import torch
        from torch.utils._pytree import tree_leaves

        for k in [k for k, (w, _) in self.live.items() if w.expired()]:  # first: a freed address can come back
            del self.live[k]
        seen = {t.untyped_storage().data_ptr() for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
        for t in tree_leaves(out):
            if not isinstance(t, torch.Tensor):
                continue
            s = t.untyped_storage()
            if s.data_ptr() in seen or s.data_ptr() in self.live or s.nbytes() == 0:
                continue
            self.live[s.data_ptr()] = (weak(s), s.nbytes())
        self.now = sum(n for _, n in self.live.values())
        self.peak = max(self.peak, self.now)


def _fused_logprob(peak: _Peak):
    """A CPU stand-in for TRL's Triton `selective_log_softmax_and_entropy`: the same allocations and saved tensors."""
    import torch

    class FusedLogProb(torch.autograd.Function):
        @staticmethod
        def forward(ctx, logits, index, temperature, row_mask):
            shape = logits.shape[:-1]
            logprobs, entropy, log_z, expected = (torch.empty(shape, dtype=torch.float32) for _ in range(4))
            peak.paused = True  # the kernel's arithmetic runs in registers, not in memory
            lp = torch.log_softmax(logits.float(), -1)
            logprobs.copy_(lp.gather(-1, index.unsqueeze(-1)).squeeze(-1))
            del lp
            peak.paused = False
            ctx.save_for_backward(logits, index, log_z, expected)
            return logprobs, entropy

        @staticmethod
        def backward(ctx, grad_logprobs, grad_entropy):
            logits = ctx.saved_tensors[0]
            return torch.empty_like(logits, memory_format=torch.contiguous_format).zero_(), None, None, None

    return lambda logits, index, temperature=1.0, row_mask=None: FusedLogProb.apply(logits, index, temperature,
                                                                                     row_mask)


def orpo_step(vocab: int, dtype_name: str, device: str = "cpu", pairs: int = 1, tokens: int = TOKENS,
              counting=contextlib.nullcontext, fused_logprob=None) -> None:
    """TRL's ORPO loss (ORPOTrainer.get_batch_loss_metrics: concatenated_forward + odds_ratio_loss) forward and
    backward on a one-layer Llama of the compute dtype `dtype_name` with `vocab` tokens, `pairs` pairs of `tokens`
    tokens, under autocast on `device` (the CPU measurement below; a GPU check runs the same on CUDA). Only the
    step runs inside `counting()`: the model and the batch exist before it. `fused_logprob`: what stands in for TRL's
    Triton log-prob kernel, for this step only (TRL's modules are left as they are: a run in this process is not
    touched)."""
    import types

    import torch
    import trl.trainer.utils as trl_utils
    from accelerate.utils import convert_outputs_to_fp32
    from transformers import LlamaConfig, LlamaForCausalLM
    from trl.experimental.orpo import ORPOTrainer

    dtype = getattr(torch, dtype_name)
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=vocab, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=tokens,
                         tie_word_embeddings=False)
    model = LlamaForCausalLM(config).to(device=device, dtype=dtype)  # the compute dtype: no per-step head cast
    model.requires_grad_(False)
    model.enable_input_require_grads()  # frozen weights, gradients through the activations (as LoRA's)
    ids = torch.randint(0, vocab, (2 * pairs, tokens), device=device)
    labels = ids.clone()
    labels[:, : tokens // 2] = -100  # the prompt half
    ones = torch.ones_like(ids)
    batch = {"chosen_input_ids": ids[:pairs], "chosen_attention_mask": ones[:pairs], "chosen_labels": labels[:pairs],
             "rejected_input_ids": ids[pairs:], "rejected_attention_mask": ones[pairs:],
             "rejected_labels": labels[pairs:]}
    accelerator = types.SimpleNamespace(device=torch.device(device), gather_for_metrics=lambda t: t)
    # TRL's own methods, on the attributes of the trainer they read
    get_batch_logps = ORPOTrainer.get_batch_logps
    if fused_logprob is not None:  # TRL's own functions, run with the stand-in in a copy of their globals
        select = trl_utils.selective_log_softmax
        select = types.FunctionType(select.__code__, {
            **select.__globals__, "is_triton_available": lambda: True, "_fused_logprob_entropy": fused_logprob,
            "_supports_trl_loss_kernel": lambda logits, index=None, row_mask=None: (
                logits.stride(-1) == 1 and index is not None and index.shape == logits.shape[:-1]
                and row_mask is None)}, select.__name__, select.__defaults__)
        get_batch_logps = types.FunctionType(get_batch_logps.__code__, {
            **get_batch_logps.__globals__, "selective_log_softmax": select}, get_batch_logps.__name__,
            get_batch_logps.__defaults__)
    trainer = types.SimpleNamespace(is_encoder_decoder=False, padding_value=0, aux_loss_enabled=False, beta=0.1,
                                    accelerator=accelerator, get_batch_logps=get_batch_logps,
                                    concatenated_inputs=ORPOTrainer.concatenated_inputs)
    trainer.concatenated_forward = functools.partial(ORPOTrainer.concatenated_forward, trainer)
    trainer.odds_ratio_loss = functools.partial(ORPOTrainer.odds_ratio_loss, trainer)
    # As Accelerator.prepare_model under mixed precision (the Trainer's own autocast is a nullcontext): autocast
    # around the model's forward only, whose 16-bit outputs accelerate converts to fp32; the loss runs outside it.
    autocast = torch.autocast(device, dtype=dtype, enabled=dtype != torch.float32)
    model.forward = types.MethodType(convert_outputs_to_fp32(autocast(model.forward.__func__)), model)
    with counting():
        loss, _ = ORPOTrainer.get_batch_loss_metrics(trainer, model, batch)
        loss.backward()
        del loss


def _peak(vocab: int, dtype_name: str) -> int:
    """Peak bytes of new storages while TRL's ORPO loss runs forward and backward on the CPU (module docstring)."""
    peak = _Peak()
    orpo_step(vocab, dtype_name, counting=lambda: peak.mode, fused_logprob=_fused_logprob(peak))
    return peak.peak


FORMULA_PER_LOGIT = 12.0  # the figure measured with torch 2.13 / TRL 1.16 (module docstring): until measured here


def orpo_key(dtype_name: str) -> str:
    from core.estimate import measure  # its disk cache (measure imports nothing of this module)

    return f"orpo_logits|v{MODEL_VERSION}|{dtype_name}|{'|'.join(measure.versions('torch', 'transformers', 'trl'))}"


def orpo_bytes_per_logit(dtype_name: str = "bfloat16") -> float:
    """Peak bytes TRL's ORPO loss holds per (row token x vocab) element of the logits at the compute dtype
    `dtype_name` ("bfloat16", "float16", "float32"), measured (module docstring); FORMULA_PER_LOGIT where it is not
    measured (in the web server, until a child has: core.estimate.measure.lookup)."""
    from core.estimate import measure

    found = measure.lookup(orpo_key(dtype_name), {"kind": "orpo", "dtype_name": dtype_name},
                           lambda: _measured(dtype_name))
    return FORMULA_PER_LOGIT if found is None else found["per_logit"]


def _measured(dtype_name: str) -> dict:
    grown = _peak(VOCABS[1], dtype_name) - _peak(VOCABS[0], dtype_name)
    return {"per_logit": grown / (ROWS_PER_PAIR * TOKENS * (VOCABS[1] - VOCABS[0]))}
