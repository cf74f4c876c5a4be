"""The LoRA variants that need more than a LoraConfig option (core/config/arguments.py `lora_kwargs` passes use_dora,
use_rslora and init_lora_weights to peft as they are).

- LoRA+ (`loraplus_lr_ratio`): peft's `create_loraplus_optimizer` puts lora_B (and every 1-D trainable tensor, DoRA's
  magnitudes included) in parameter groups with `ratio` times the learning rate. It is handed to the Trainer as an
  optimizer factory (`optimizer_cls_and_kwargs`), built when the Trainer builds its optimizer, over the class and
  arguments the Trainer itself would use for `optim` (bitsandbytes' 8-bit/paged AdamW stays 8-bit/paged).
- PiSSA / OLoRA (`lora_init`): peft moves the adapter's start out of the base weights (W = W_res + B0 A0), so the
  trained adapter only fits that residual base, which memtune never saves. `keep_initial` copies the initial
  adapter right after get_peft_model, and `conversion` writes it for peft's save_pretrained(
  path_initial_model_for_weight_conversion=...), which saves the update B A - B0 A0 as a plain LoRA of twice the rank
  for the original base: Try it, merge and GGUF export then need nothing special.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import tempfile
from pathlib import Path
from typing import Any, Iterator

INITIAL = "memtune_initial"  # the initial adapter's name while peft converts (a folder of that name)


def loraplus_optimizer(args, ratio: float, weight_decay: float) -> tuple[Any, dict[str, Any]]:
    """(factory, kwargs) for the Trainer's `optimizer_cls_and_kwargs`: the Trainer calls factory()(model, **kwargs),
    i.e. peft's create_loraplus_optimizer(model, optimizer_cls, lr=..., loraplus_lr_ratio=ratio, ...)."""
    from peft.optimizers import create_loraplus_optimizer
    from transformers import Trainer

    optimizer_cls, kwargs = Trainer.get_optimizer_cls_and_kwargs(args)  # what `optim` would build: class + betas...
    kwargs = {**kwargs, "optimizer_cls": optimizer_cls, "loraplus_lr_ratio": ratio,
              "loraplus_weight_decay": weight_decay}
    # A factory for transformers: not an Optimizer subclass; called with no argument, it gives the builder
    return functools.partial(functools.partial, create_loraplus_optimizer), kwargs


def keep_initial(model) -> None:
    """A CPU copy of the freshly initialised adapter (PiSSA/OLoRA), for `conversion` at save time."""
    from peft import get_peft_model_state_dict

    model.memtune_initial_adapter = {k: v.detach().to("cpu", copy=True)
                                     for k, v in get_peft_model_state_dict(model).items()}


@contextlib.contextmanager
def conversion(model) -> Iterator[dict[str, Any]]:
    """save_pretrained's extra arguments: for a PiSSA/OLoRA model, the initial adapter written to a temporary folder
    as peft's procedure asks (init_lora_weights=True, so loading it does not move the base again); else none."""
    initial = getattr(model, "memtune_initial_adapter", None)
    if initial is None:
        yield {}
        return
    from safetensors.torch import save_file

    with tempfile.TemporaryDirectory(prefix="memtune-init-") as tmp:
        folder = Path(tmp) / INITIAL
        config = copy.deepcopy(model.peft_config["default"])
        config.init_lora_weights = True
        config.save_pretrained(str(folder))
        save_file({k: v.contiguous() for k, v in initial.items()}, str(folder / "adapter_model.safetensors"))
        yield {"path_initial_model_for_weight_conversion": str(folder)}
