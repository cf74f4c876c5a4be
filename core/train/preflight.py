"""Any model trains exactly what was asked: decided from its config before loading, checked on it before step 1.

`before_loading(cfg, tree, plan, emit)`: from config.json and the module tree on the meta device (no weights), the
changes a model needs (core/model/families.py `traits` / `adapt`): a recurrent, convolutional or state-space mixer
(lfm2, qwen3_next, granitemoehybrid, recurrent_gemma, mamba-style layer_types) never gets packed rows; a model
without a FlashAttention path (BLOOM, MPT: their own mask code) neither; alibi or a model outside transformers'
AttentionInterface never gets memtune's varlen attention (flash-attention's mask builder gives it no bias); attention
sinks (gpt-oss) with packed rows run the model's own eager attention per row. One keyed log line per change: why and
what it costs.

`check(trainer, cfg, emit, adapted)`: the pre-flight phase, after the model loaded with LoRA and before step 1, on
the user's own model and data, a few forward passes without gradients:
  1. row separation (packed runs): the first packs of real rows, collated by the trainer's own collator exactly as
     training packs them, against each row alone: logits within ROW_TOLERANCE (relative L2);
  2. the loss path: TRL's fused loss head (what training computes) against the loss from the model's own logits,
     within LOSS_TOLERANCE (relative);
  3. LoRA landed on exactly the layers asked for, and nowhere else.
A failure switches to the exact path (rows unpacked: the caller builds the trainer again; the model's own logits for
the loss) with a line saying why and what it costs, or refuses the run by name (LoRA). The results go to summary.json
("preflight"). The families of README's matrix (families.VERIFIED) skip checks 1 and 2, which tests/test_families.py
makes on every preset for them (the log says so); every other model runs all three: a few forward passes on one
pack of real rows.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import torch

from core.config.arguments import sharded
from core.config.settings import TrainConfig
from core.messages import Said, keyed, words_of
from core.model import families
from core.model import lora_targets as lt
from core.model.load import ModelError
from core.runs.events import EventSink, make_event
from core.train.callbacks import phase

# relative L2 error of logits (row separation) and relative loss error (loss path), by compute precision: fp32 is
# exact up to summation order; bf16/fp16 carry ~3 significant digits through every layer
ROW_TOLERANCE = {"fp32": 1e-4, "bf16": 3e-2, "fp16": 3e-2}
LOSS_TOLERANCE = {"fp32": 1e-5, "bf16": 1e-2, "fp16": 1e-2}
PACKS = 1  # packs (or rows) the checks run on: one pack holds several rows

def _log(emit: EventSink, said: Said, level: str = "warning") -> None:
    emit(make_event("log", level=level, **words_of(said)))


def before_loading(cfg: TrainConfig, tree, plan, emit: EventSink) -> tuple[TrainConfig, list[dict[str, Any]]]:
    """`cfg` as this model can train it exactly (families.adapt on its config and `tree`, its module tree on the
    meta device: core.model.load.skeleton), each change said, and the changes as summary.json lists them; the data
    plan follows (no packs when rows go unpacked)."""
    changes, said = families.adapt(cfg, families.traits(tree.config, tree))
    adapted = []
    for line in said:
        _log(emit, line)
        adapted.append({"key": line.key, **{k: v for k, v in line.params.items() if isinstance(v, (str, int))}})
    if not changes:
        return cfg, adapted
    if "packing" in changes and plan is not None:
        plan.packing, plan.n_packs = changes["packing"], None
    return cfg.replace(**changes), adapted


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.float(), b.float()
    return float((a - b).norm() / b.norm().clamp(min=1e-12))


def _to(batch: dict, device) -> dict:
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


def _batches(trainer, n: int) -> list[dict]:
    """The first `n` micro-batches of single dataset entries (a pack, or a row), as the trainer's collator makes them."""
    data = trainer.train_dataset
    return [trainer.data_collator([data[i]]) for i in range(min(n, len(data)))]


def rows_apart(model, batches: list[dict], device) -> dict[str, Any]:
    """Each pack's logits against its rows' logits when each row runs alone: the largest relative error over the
    rows after a pack's first, and the first rows' (the noise floor: the first row cannot see another)."""
    worst, floor, rows, first = 0.0, 0.0, 0, None
    for batch in batches:
        batch = _to(batch, device)
        cu = batch.get("cu_seq_lens_q")
        if cu is None:
            starts = (batch["position_ids"][0] == 0).nonzero().flatten()
            cu = torch.cat([starts, starts.new_tensor([batch["position_ids"].shape[-1]])])
        inputs = {k: v for k, v in batch.items() if k != "labels"}
        packed = model(**inputs, use_cache=False).logits[0]
        first = packed[None] if first is None else first
        for i, (s, e) in enumerate(zip(cu[:-1].tolist(), cu[1:].tolist())):
            ids = batch["input_ids"][:, s:e]
            alone = model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False).logits[0]
            err = _relative(packed[s:e], alone)
            rows += 1
            if i == 0:
                floor = max(floor, err)
            else:
                worst = max(worst, err)
    return {"rows": rows, "error": worst, "first_row_error": floor, "logits": first}


def loss_paths(model, batch: dict, device, logits: torch.Tensor | None = None) -> dict[str, Any]:
    """The loss TRL's fused head computes (its negative log-likelihood) against the loss from the model's own
    logits (its own loss function) on the same tokens (`logits`: already computed for this batch)."""
    batch = _to(batch, device)
    labels = batch["labels"]
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    fused = model(**batch, use_cache=False, fused_lm_head=True)
    fused_loss = float(-fused.log_probs.float().sum() / fused.label_mask.sum().clamp(min=1))
    if logits is None:
        logits = model(**inputs, use_cache=False).logits
    own = float(model.loss_function(logits.float(), labels, vocab_size=logits.shape[-1]))
    return {"fused": fused_loss, "own": own, "error": abs(fused_loss - own) / max(abs(own), 1e-12)}


def lora_landed(model, cfg: TrainConfig) -> dict[str, Any]:
    """Where peft put LoRA against where it was asked (lora_targets.resolve on the model itself)."""
    from peft.tuners.lora import LoraLayer

    from peft.tuners.lora import layer as lora_layer

    base = model.get_base_model()
    asked = lt.resolve(cfg.lora_target_modules, lt.linear_layers(base), cfg.lora_r)
    expected = set(lt.paths(base, asked.modules))
    # LoRA on parameters (lora_experts: peft's target_parameters on MoE experts) wraps the experts module itself
    by_parameter = getattr(lora_layer, "ParamWrapper", ())
    on_params = {name for name, m in base.named_modules() if by_parameter and isinstance(m, by_parameter)}
    landed = {name for name, m in base.named_modules() if isinstance(m, LoraLayer)} - on_params
    missing = sorted(expected - landed) + (["experts"] if cfg.lora_experts and not on_params else [])
    unasked = sorted(landed - expected) + ([] if cfg.lora_experts else sorted(on_params))
    return {"layers": len(landed), "modules": asked.modules, "missing": missing[:5], "unasked": unasked[:5],
            "parameters": len(on_params)}


def own_logits_loss(model) -> Callable:
    """The loss from the model's own logits (transformers' loss function for it, plus the MoE router loss as the
    model adds it): what SFTTrainer computes when given a compute_loss_func, instead of its fused head."""
    text = model.config.get_text_config()

    def loss(outputs, labels, num_items_in_batch=None):
        value = model.loss_function(outputs.logits, labels, vocab_size=outputs.logits.shape[-1],
                                    num_items_in_batch=num_items_in_batch)
        aux = getattr(outputs, "aux_loss", None)
        if aux is not None and getattr(text, "router_aux_loss_coef", 0.0):
            value = value + text.router_aux_loss_coef * aux.to(value.device)
        return value

    return loss


def check(trainer, cfg: TrainConfig, emit: EventSink, adapted: list[dict[str, Any]]) -> TrainConfig:
    """The pre-flight phase (module docstring) on `trainer`: the config the run trains, unpacked when packed rows
    bled into each other (the caller then builds the trainer again; `carry` hands it this one's decisions). Results
    in trainer.memtune_preflight (summary.json's "preflight"), with before_loading's changes (`adapted`)."""
    started = time.monotonic()
    result: dict[str, Any] = {"adapted": adapted}
    with phase(emit, "preflight", "log.phase.preflight"):
        model = trainer.model
        text = model.config.get_text_config()
        if getattr(text, "output_router_logits", False) and not hasattr(text, "num_experts") \
                and hasattr(text, "num_local_experts"):
            # TRL's fused head reads the expert count as num_experts (granitemoehybrid names it num_local_experts)
            text.num_experts = text.num_local_experts
        device = trainer.args.device  # where the Trainer puts each batch (the embedding may live in CPU memory)
        verified = getattr(text, "model_type", None) in families.VERIFIED
        result["verified"] = verified
        if sharded(cfg):  # FSDP places the shards when training starts: no whole model to run here yet
            verified, result["skipped"] = True, "fsdp"
        tol_rows, tol_loss = ROW_TOLERANCE[cfg.precision], LOSS_TOLERANCE[cfg.precision]
        result["tolerance"] = {"rows": tol_rows, "loss": tol_loss}
        was_training = model.training
        model.eval()  # no dropout: the same rows give the same logits
        try:
            with torch.no_grad(), trainer.compute_loss_context_manager():
                lora = lora_landed(model, cfg)
                result["lora"] = lora
                unread = families.traits(model.config).unread_logit
                if verified:  # tests/test_families.py checks these paths on every preset for the matrix's families
                    loss = {"error": 0.0, "ok": True, "skipped": "verified family"}
                elif cfg.stage != "sft":  # TRL's preference loss on unpacked pairs: no SFT rows or fused head to check
                    loss = {"error": 0.0, "ok": True, "skipped": f"stage {cfg.stage}"}
                else:
                    batches = _batches(trainer, PACKS)
                    logits = None
                    if cfg.packing:
                        rows = rows_apart(model, batches, device)
                        logits = rows.pop("logits")
                        rows["ok"] = rows["error"] <= max(tol_rows, 4 * rows["first_row_error"])
                        result["rows"] = rows
                    loss = loss_paths(model, batches[0], device, logits)
                    loss["ok"] = loss["error"] <= tol_loss and not unread
                result["loss"] = loss
        finally:
            model.train(was_training)
        if lora["missing"] or lora["unasked"]:
            raise ModelError("model.err.lora_landed", model=cfg.model, missing=", ".join(lora["missing"]) or "-",
                             unasked=", ".join(lora["unasked"]) or "-")
        if not result.get("rows", {"ok": True})["ok"]:
            rows = result["rows"]
            emit(make_event("log", level="warning", **keyed("log.preflight.unpacked", model=cfg.model,
                                                            error=rows["error"], tolerance=tol_rows)))
            cfg = cfg.replace(packing=False, attention="sdpa")
            result["switched_to"] = "unpacked"
        if not loss["ok"]:
            trainer.compute_loss_func = own_logits_loss(trainer.model)
            why = (Said("log.preflight.why_unread", names=", ".join(unread)) if unread else
                   Said("log.preflight.why_differs", fused=loss["fused"], own=loss["own"], error=loss["error"]))
            _log(emit, Said("log.preflight.own_head", why=why))
            result["loss_path"] = "own_logits"
        else:
            result["loss_path"] = "fused"
        result["seconds"] = round(time.monotonic() - started, 3)
        if verified:
            _log(emit, Said("log.preflight.verified", lora=lora["layers"], model_type=text.model_type), level="info")
        else:
            _log(emit, Said("log.preflight.done", rows=(Said("log.preflight.rows_ok", n=result["rows"]["rows"],
                                                         error=result["rows"]["error"])
                                                        if result.get("rows", {}).get("ok") else
                                                        Said("log.preflight.no_packs")),
                            loss=loss["error"], lora=lora["layers"], seconds=result["seconds"]), level="info")
    trainer.memtune_preflight = result
    return cfg


def carry(checked, trainer):
    """`trainer`, built again after the pre-flight on `checked` switched to unpacked rows, with what it decided:
    the loss path and the results."""
    trainer.compute_loss_func = checked.compute_loss_func
    trainer.memtune_preflight = checked.memtune_preflight
    return trainer
