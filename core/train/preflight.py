"""Any model trains exactly what was asked: checked on the user's own model and rows before step 1.

What a model needs from its config alone (a stateful mixer never gets packed rows, alibi never gets varlen, ...) is
decided before loading, with the rest of the run, by core/model/resolve.py (families.adaptations); `adapted` lists
those changes for summary.json. On the loaded model with LoRA, a few forward passes without gradients:
  1. row separation (packed runs), `rows`, before the trainer exists: the first packs of real rows, packed by TRL's
     own packing and collated by the collator SFTTrainer builds for the same arguments (`trainer_collator`), against
     each row alone: logits within ROW_TOLERANCE (relative L2). A failure unpacks the rows (the caller adds it to the
     ResolvedRun, with a line saying why and what it costs), so the one trainer is built on unpacked rows;
  2. `check`, on the trainer: LoRA landed on exactly the layers asked for, and nowhere else (or the run is refused by
     name), and the loss path: TRL's fused loss head (what training computes) against the loss from the model's own
     logits, within LOSS_TOLERANCE (relative). A difference, or a fused head that fails on the model, sets the
     trainer's compute_loss_func to the model's own logits (and, where the fused head failed, TRL's fused forward
     computes from those logits too: `logits_head`), with a line saying why.
The results go to summary.json ("preflight"). The families of README's matrix (families.VERIFIED) skip checks 1 and
the loss path, which tests/test_families.py makes on every preset for them (the log says so); every other model runs
them all: a few forward passes on one pack of real rows.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Protocol

import torch

from core.config.arguments import sharded
from core.config.slices import DataSlice, LoraSlice, ModelSlice, PlaceSlice, StageSlice
from core.messages import Said, words_of
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


class _Packed(DataSlice, StageSlice, PlaceSlice, Protocol):
    """Whether the rows pack: packing, the stage (preference pairs never pack) and FSDP (no whole model here)."""


class _Checked(ModelSlice, LoraSlice, StageSlice, PlaceSlice, Protocol):
    """The trainer's checks: the layers LoRA was asked for, the loss path of the stage and precision, FSDP."""


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


def lora_landed(model, cfg: LoraSlice) -> dict[str, Any]:
    """Where peft put LoRA against where it was asked (lora_targets.resolve on the model itself)."""
    from peft.tuners.lora import LoraLayer

    from peft.tuners.lora import layer as lora_layer

    from core.levers.expert_lora import ExpertLoRA

    base = model.get_base_model()
    asked = lt.resolve(cfg.lora_target_modules, lt.adaptable_layers(base, cfg.lora_vision), cfg.lora_r)
    expected = set(lt.paths(base, asked.modules, cfg.lora_vision))
    # LoRA on parameters (lora_experts: peft's target_parameters on MoE experts) wraps the experts module itself
    # (on 4-bit experts: memtune's ExpertLoRA on each experts weight, core/levers/expert_lora.py)
    by_parameter = tuple(c for c in (getattr(lora_layer, "ParamWrapper", None), ExpertLoRA) if c is not None)
    on_params = {name for name, m in base.named_modules() if isinstance(m, by_parameter)}
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


def logits_head(model) -> None:
    """TRL's fused-head forward (trl add_fused_lm_head, on the base model under peft) made to compute its outputs
    from the model's own logits: what the trainer's metrics call (`fused_lm_head=True`) still runs once the loss
    comes from the logits (`own_logits_loss`), on a model whose fused head fails. Same fields, same loss."""
    from trl.trainer.utils import FusedCausalLMOutput

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    fused = base.forward  # TRL's: without fused_lm_head, the model's own forward

    def forward(*args, fused_lm_head=False, labels=None, shift_labels=None, num_items_in_batch=None, **kwargs):
        if not fused_lm_head:
            return fused(*args, labels=labels, shift_labels=shift_labels, num_items_in_batch=num_items_in_batch,
                         **kwargs)
        kwargs["use_cache"] = False
        out = fused(*args, **kwargs)
        logits = out.logits if shift_labels is not None else out.logits[:, :-1]
        labels = shift_labels if shift_labels is not None else labels[:, 1:]
        mask = labels != -100
        logp = torch.log_softmax(logits.float(), dim=-1)
        log_probs = logp.gather(-1, labels.clamp(min=0)[..., None]).squeeze(-1).masked_fill(~mask, 0.0)
        entropy = -(logp.exp() * logp).sum(-1).masked_fill(~mask, 0.0)
        loss = -log_probs.sum() / (mask.sum().clamp(min=1) if num_items_in_batch is None else num_items_in_batch)
        return FusedCausalLMOutput(loss=loss, log_probs=log_probs, entropy=entropy, label_mask=mask,
                                   is_top1=(logits.argmax(-1) == labels) & mask,
                                   aux_loss=getattr(out, "aux_loss", None))

    base.forward = forward


def checks_rows(model, cfg: _Packed) -> bool:
    """Whether check 1 runs: packed SFT rows of a model outside README's matrix, not sharded (FSDP places the shards
    when training starts: no whole model to run before it)."""
    model_type = getattr(model.config.get_text_config(), "model_type", None)
    return cfg.packing and cfg.stage == "sft" and model_type not in families.VERIFIED and not sharded(cfg)


def trainer_collator(args, tokenizer):
    """The collator SFTTrainer builds for `args` when given none (trl's SFTTrainer.__init__): TRL's own class, with
    the pad token and padding-free mode it chooses (bfd packing implies padding-free)."""
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    padding_free = args.padding_free or (args.packing and args.packing_strategy in {"bfd", "bfd_split"})
    pad = args.pad_token or tokenizer.pad_token or tokenizer.eos_token
    return DataCollatorForLanguageModeling(pad_token_id=tokenizer.convert_tokens_to_ids(pad),
                                           padding_free=padding_free, pad_to_multiple_of=args.pad_to_multiple_of)


def packed(rows, args):
    """Tokenized `rows` (input_ids, labels) packed as SFTTrainer packs them for `args` (its _prepare_dataset)."""
    from trl import pack_dataset

    rows = rows.select_columns(["input_ids", "labels"])
    if args.shuffle_dataset:
        rows = rows.shuffle(seed=args.seed)
    rows = pack_dataset(rows, args.max_length, args.packing_strategy)
    return rows.shuffle(seed=args.seed) if args.shuffle_dataset else rows


def rows(model, cfg: ModelSlice, args, tokenizer, train_rows, emit: EventSink) -> tuple[dict[str, Any], Said | None]:
    """Check 1 (module docstring) on `model`, before the trainer is built with `args`: the first packs of
    `train_rows` (the plan's tokenized rows) as the trainer will pack and collate them, each against its rows alone.
    The result (summary.json's preflight "rows"), and the reason to train unpacked when packed rows see each other."""
    started = time.monotonic()
    with phase(emit, "preflight", "log.phase.preflight"):
        data = packed(train_rows, args)
        collator = trainer_collator(args, tokenizer)
        batches = [collator([data[i]]) for i in range(min(PACKS, len(data)))]
        was_training = model.training
        model.eval()  # no dropout: the same rows give the same logits
        try:
            with torch.no_grad():
                result = rows_apart(model, batches, args.device)  # where the Trainer puts each batch
        finally:
            model.train(was_training)
    result.pop("logits")
    result["seconds"] = round(time.monotonic() - started, 3)
    tolerance = ROW_TOLERANCE[cfg.precision]
    result["ok"] = result["error"] <= max(tolerance, 4 * result["first_row_error"])
    why = None if result["ok"] else Said("log.preflight.unpacked", model=cfg.model, error=result["error"],
                                         tolerance=tolerance)
    return result, why


def check(trainer, cfg: _Checked, emit: EventSink, adapted: list[dict[str, Any]],
          rows_result: dict[str, Any] | None = None) -> None:
    """The pre-flight phase (module docstring, check 2) on `trainer`, built on the run's final config: the loss
    path it trains with, or the run refused when LoRA did not land as asked. Results in trainer.memtune_preflight
    (summary.json's "preflight"), with the family's adaptations (`adapted`) and check 1's result (`rows_result`;
    "switched_to": unpacked where it unpacked the rows)."""
    started = time.monotonic()
    result: dict[str, Any] = {"adapted": adapted}
    if rows_result is not None:
        result["rows"] = rows_result
        if not rows_result["ok"]:
            result["switched_to"] = "unpacked"
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
                    batch = _batches(trainer, PACKS)[0]
                    try:
                        loss = loss_paths(model, batch, device)
                        loss["ok"] = loss["error"] <= tol_loss and not unread
                    except Exception as exc:  # noqa: BLE001 - TRL's fused head cannot run this model (e.g. a
                        # backbone it does not find by base_model_prefix): the model's own logits, checked below
                        loss = {"error": None, "ok": False, "failed": f"{type(exc).__name__}: {exc}"[:300]}
                        logits_head(model)
                        loss["own"] = loss_paths(model, batch, device)["own"]  # the fallback runs, or the run fails
                result["loss"] = loss
        finally:
            model.train(was_training)
        if lora["missing"] or lora["unasked"]:
            raise ModelError("model.err.lora_landed", model=cfg.model, missing=", ".join(lora["missing"]) or "-",
                             unasked=", ".join(lora["unasked"]) or "-")
        if not loss["ok"]:
            trainer.compute_loss_func = own_logits_loss(trainer.model)
            why = (Said("log.preflight.why_failed", error=loss["failed"]) if loss.get("failed") else
                   Said("log.preflight.why_unread", names=", ".join(unread)) if unread else
                   Said("log.preflight.why_differs", fused=loss["fused"], own=loss["own"], error=loss["error"]))
            _log(emit, Said("log.preflight.own_head", why=why))
            result["loss_path"] = "own_logits"
        else:
            result["loss_path"] = "fused"
        result["seconds"] = round(time.monotonic() - started + (rows_result or {}).get("seconds", 0.0), 3)
        if verified:
            _log(emit, Said("log.preflight.verified", lora=lora["layers"], model_type=text.model_type), level="info")
        else:
            rows_said = (Said("log.preflight.rows_ok", n=result["rows"]["rows"], error=result["rows"]["error"])
                         if result.get("rows", {}).get("ok") else Said("log.preflight.no_packs"))
            _log(emit, Said("log.preflight.done_own", rows=rows_said, lora=lora["layers"], seconds=result["seconds"])
                 if loss.get("failed") else
                 Said("log.preflight.done", rows=rows_said, loss=loss["error"], lora=lora["layers"],
                      seconds=result["seconds"]), level="info")
    trainer.memtune_preflight = result
