"""quantize_output_head: the frozen output head stored in 4-bit NF4, read by TRL's fused loss a chunk of rows at a time.

`quantize_output_head` (core.model.load.prepare_for_training calls it) swaps the head for a `QuantizedHead`, whose
weight is an `NF4Rows`: a placeholder that dequantizes only the rows sliced from it.
"""

from __future__ import annotations

import torch

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


def embeddings_tied(model) -> bool:
    """Whether the output head shares the input embedding's matrix: then neither lever moves or quantizes it."""
    inp, out = model.get_input_embeddings(), model.get_output_embeddings()
    if out is None or getattr(inp, "weight", None) is None or getattr(out, "weight", None) is None:
        return False
    return inp.weight is out.weight or inp.weight.data_ptr() == out.weight.data_ptr()


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
