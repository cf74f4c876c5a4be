"""One string table for the whole interface, in English, Portuguese and French.

`t(key, lang, **fmt)` returns the text for `key` in `lang` with its {placeholders} filled; a language or key
that is missing falls back to English (then to the key itself), so a gap shows as English text, never as a
crash. Tests check that every key exists in every language with the same placeholders.

Keys are dotted: `field.<TrainConfig field>` (widget label), `help.<field>` (its help, English = config.field_help),
`checklist.<item key>.label` / `.tradeoff` (English = core.checklist.ITEMS, Portuguese and French in the course
chapter's own wording), then one group per part of the page (tab., data., run., progress., result., gauge., try.,
export., history., msg., ...). Engine messages (ConfigError problems, DataError, ...) stay in English: they name
fields and files and are shown verbatim.

`detect_language(accept_language)` picks en/pt/fr from a browser's Accept-Language header (default en).
"""

from __future__ import annotations

import re
import string
from typing import Any

LANGUAGES = {"en": "English", "pt": "Português", "fr": "Français"}  # code -> name shown in the picker
DEFAULT_LANGUAGE = "en"

EN: dict[str, str] = {
    # --- page --------------------------------------------------------------------------------------------------
    "app.title": "memtune: QLoRA fine-tuning",
    "app.tagline": "QLoRA fine-tuning on your own GPU, with the memory checklist in front of you.",
    "app.gpu_line": "GPU: {gpus}. Opened on the chapter's recipe (QLoRA on Llama-3.1-8B).",
    "app.no_gpu_line": ("No CUDA GPU here: opened on the offline demo (a tiny model that learns English → French "
                        "words in under a minute on the CPU). Press Start to try it."),
    "app.language": "Language",
    "tab.data": "1 · Model & data",
    "tab.checklist": "2 · Memory checklist",
    "tab.training": "3 · Training",
    "tab.code": "4 · Settings & code",
    "tab.try": "Try it",
    "tab.export": "Export",
    "tab.history": "History",
    "preset.demo": "Offline demo settings",
    "preset.chapter": "Chapter recipe (GPU)",
    "preset.demo_loaded": "Loaded the offline demo settings.",
    "preset.chapter_loaded": "Loaded the chapter's recipe.",
    # --- model and data ------------------------------------------------------------------------------------------
    "data.rescan": "↻ Rescan cache",
    "data.upload": "…or upload a data file ({types})",
    "data.preview": "Preview the data as it will be trained",
    "data.upload_not_used": "Upload not used",
    "data.bad_type": "{name}: memtune reads {types} files",
    "preview.format": "Format: {format}",
    "preview.rows": "{n} rows",
    "preview.dropped": "{n} empty rows dropped",
    "preview.tokens": "tokens: median {median}, p95 {p95}, max {max}",
    "preview.over": "{n} of {rows} rows are longer than max_length {max_length} and will be truncated",
    "preview.fits": "every row fits in max_length {max_length}",
    "preview.example": "example {n}",
    "preview.prompt": "prompt (not trained on)",
    "preview.completion": "completion (trained on)",
    "preview.histogram": "token length histogram",
    "preview.cannot": "Cannot preview: fix these settings",
    "preview.tokenizer_error": "The model's tokenizer could not be loaded",
    "preview.data_error": "The data cannot be used as it is",
    "preview.read_error": "The data could not be read",
    # --- checklist -----------------------------------------------------------------------------------------------
    "checklist.title": "Memory checklist",
    "checklist.intro": ("The chapter's seven memory savers, in its order. Ticking one changes the settings it "
                        "governs (shown on the right); the summary and the code follow."),
    "checklist.beyond": "Beyond the chapter",
    "checklist.at_settings": "{tradeoff} At these settings: {saving}.",
    "checklist.needs_readable": "Fix the settings listed in the summary first; the checklist needs readable settings.",
    "checklist.qlora.label": "Use QLoRA (4-bit quantization)",
    "checklist.qlora.tradeoff": (
        "Stores the frozen base weights in 4-bit NF4: ~4x less weight memory (an 8B model: ~15 GiB -> ~5.4 GiB "
        "with bf16 embeddings). Costs dequantization work every step and a little accuracy."),
    "checklist.gradient_checkpointing.label": "Enable gradient checkpointing",
    "checklist.gradient_checkpointing.tradeoff": (
        "Recomputes each layer's activations in the backward pass instead of storing them. Saves activation "
        "memory that grows with batch x length (the estimate beside this box says how much at your settings); "
        "costs ~25-35% more compute per step."),
    "checklist.gradient_accumulation.label": "Use gradient accumulation",
    "checklist.gradient_accumulation.tradeoff": (
        "Sums gradients over several small micro-batches before each update, so a large effective batch needs "
        "only one micro-batch of activations. Costs nothing in memory; small micro-batches use the GPU poorly."),
    "checklist.efficient_optimizer.label": "Use an 8-bit or paged optimizer",
    "checklist.efficient_optimizer.tradeoff": (
        "Keeps Adam's two moments in 8 bits (and pages them to CPU RAM under pressure): 2 bytes per trainable "
        "parameter instead of 8. With LoRA the trainable set is small, so the saving is tens of MiB, not GiB."),
    "checklist.bf16.label": "Use bfloat16 precision",
    "checklist.bf16.tradeoff": (
        "Computes in 16-bit brain-float: half the activation memory of fp32 and fast tensor cores, with fp32's "
        "range (no loss scaling). Needs an Ampere-or-newer GPU; older GPUs use fp16."),
    "checklist.short_max_length.label": "Reduce max_seq_length if possible",
    "checklist.short_max_length.tradeoff": (
        "Caps each row at 512 tokens: activations and logits grow linearly with length. Rows longer than the cap "
        "are truncated, so check the token-length histogram first."),
    "checklist.small_batches.label": "Use smaller batches",
    "checklist.small_batches.tradeoff": (
        "One row per micro-batch: the least activation memory. Accumulation keeps the effective batch. Costs "
        "speed: each micro-step has a fixed overhead, so batch 1 uses a large GPU poorly."),
    # --- settings: labels (one per TrainConfig field) -------------------------------------------------------------
    "field.model": "Model (Hub id or local folder)",
    "field.trust_remote_code": "Trust remote code",
    "field.load_in_4bit": "Load the base model in 4 bits (QLoRA)",
    "field.bnb_4bit_quant_type": "4-bit data type",
    "field.bnb_4bit_use_double_quant": "Double quantization",
    "field.precision": "Compute precision",
    "field.upcast_to_fp32": "Upcast norms and embeddings to fp32 (the chapter's recipe)",
    "field.offload_embeddings": "Keep the input embedding in CPU memory",
    "field.expandable_segments": "Expandable CUDA memory segments",
    "field.lora_r": "LoRA rank r",
    "field.lora_alpha": "LoRA alpha",
    "field.lora_dropout": "LoRA dropout",
    "field.lora_target_modules": "LoRA target modules",
    "field.dataset": "Dataset (Hub id, local file, or the demo)",
    "field.dataset_split": "Split",
    "field.dataset_format": "Row format",
    "field.max_length": "Max length (tokens)",
    "field.per_device_train_batch_size": "Micro-batch size",
    "field.gradient_accumulation_steps": "Accumulation steps",
    "field.packing": "Packing (padding-free batches)",
    "field.num_train_epochs": "Epochs",
    "field.max_steps": "Max steps (-1 = use epochs)",
    "field.learning_rate": "Learning rate",
    "field.lr_scheduler_type": "LR schedule",
    "field.warmup_steps": "Warm-up steps",
    "field.weight_decay": "Weight decay",
    "field.max_grad_norm": "Gradient clipping (max norm)",
    "field.optim": "Optimizer",
    "field.gradient_checkpointing": "Gradient checkpointing",
    "field.use_liger_kernel": "Fused loss kernels (liger, CUDA only)",
    "field.seed": "Seed",
    "field.logging_steps": "Log every N steps",
    "field.save_strategy": "Save checkpoints",
    "field.save_steps": "Save every N steps",
    "field.output_dir": "Output folder",
    "field.run_name": "Run name (empty = timestamp)",
    "field.resume_from": "Resume from run folder",
    "field.device": "Device",
    # --- settings: help (English = core.config.field_help) -----------------------------------------------------
    "help.model": "Hub id (org/name) or local folder of a causal LM. memtune/demo-tiny-llama is the offline demo.",
    "help.trust_remote_code": "Run Python code shipped with the model. Off unless you trust its author.",
    "help.load_in_4bit": "QLoRA: store the frozen base weights in 4 bits.",
    "help.bnb_4bit_quant_type": "4-bit data type: nf4 or fp4.",
    "help.bnb_4bit_use_double_quant": "Quantize the quantization constants too (~0.4 bit/parameter saved).",
    "help.precision": "Compute dtype: bf16, fp16 or fp32.",
    "help.upcast_to_fp32": (
        "What prepare_model_for_kbit_training does (the chapter's recipe): cast embeddings, norms and lm_head to "
        "float32. Costs ~4 GiB on an 8B Llama-3 for little gain; off keeps them in the compute dtype."),
    "help.offload_embeddings": (
        "Keep the frozen input embedding (vocabulary x hidden: ~1 GiB on Llama-3 8B) in CPU memory; only the rows "
        "a batch looks up go to the GPU. Same results. No effect where the embedding is tied to the output head "
        "(e.g. Llama-3.2 1B/3B) or without a GPU."),
    "help.expandable_segments": (
        "Let PyTorch's CUDA allocator grow memory segments in place (expandable_segments) instead of caching many "
        "fixed blocks: less memory reserved but unused, so a lower GPU peak. Same results. CUDA only."),
    "help.lora_r": "LoRA rank.",
    "help.lora_alpha": "LoRA scaling numerator (scale = alpha / r).",
    "help.lora_dropout": "Dropout on the LoRA input.",
    "help.lora_target_modules": "Linear layers that get LoRA adapters.",
    "help.dataset": "Hub dataset id, a local .jsonl/.json/.csv/.parquet/.txt file, or memtune/demo.",
    "help.dataset_split": "Split with optional slicing, e.g. train[:1000].",
    "help.dataset_format": "Row format; auto detects it from the columns.",
    "help.max_length": "Longest training sequence in tokens; longer rows are truncated.",
    "help.per_device_train_batch_size": "Rows per micro-batch.",
    "help.gradient_accumulation_steps": (
        "Micro-batches summed before each optimizer step (effective batch = batch x accumulation)."),
    "help.packing": (
        "Padding-free batches: rows are concatenated with per-row position ids, so no compute goes to padding."),
    "help.num_train_epochs": "Passes over the data.",
    "help.max_steps": "Stop after this many optimizer steps; -1 uses epochs.",
    "help.learning_rate": "Peak learning rate.",
    "help.lr_scheduler_type": "Learning-rate schedule.",
    "help.warmup_steps": "Linear warm-up, in optimizer steps.",
    "help.weight_decay": "AdamW weight decay.",
    "help.max_grad_norm": "Gradient clipping norm; 0 disables.",
    "help.optim": "Optimizer; the 8-bit and paged ones need bitsandbytes.",
    "help.gradient_checkpointing": "Recompute activations in the backward pass instead of keeping them.",
    "help.use_liger_kernel": (
        "Fused Triton kernels (liger-kernel): chunked linear + cross-entropy so the full logits never exist. "
        "CUDA only."),
    "help.seed": "Random seed for data order, LoRA init and dropout.",
    "help.logging_steps": "Log loss every N optimizer steps.",
    "help.save_strategy": "When to write checkpoints.",
    "help.save_steps": "Checkpoint interval when save_strategy is steps.",
    "help.output_dir": "Folder holding one sub-folder per run.",
    "help.run_name": "Run folder name; empty picks a timestamped name.",
    "help.resume_from": "A run folder to continue from its newest complete checkpoint; empty starts fresh.",
    "help.device": "auto (CUDA if present), cuda or cpu.",
    # --- training tab, saved settings, code ----------------------------------------------------------------------
    "training.advanced": "Advanced",
    "training.resume_placeholder": "e.g. runs/run-20260101-120000",
    "config.name": "Name",
    "config.name_placeholder": "my-run",
    "config.name_info": "Saved as YAML under {dir}/",
    "config.save": "Save settings",
    "config.saved_list": "Saved settings",
    "config.load": "Load",
    "config.give_name": "Give the settings a name first.",
    "config.bad_name": ("{name} is not a usable name: use 1-64 letters, digits, dots, dashes or underscores, "
                        "starting with a letter or digit (no slashes or spaces)."),
    "config.saved": "Saved {path}. Train it headless with:\n{command}",
    "config.replaced": "Replaced {path}. Train it headless with:\n{command}",
    "config.not_saved": "Not saved: these settings cannot be read",
    "config.pick": "Pick a saved configuration first.",
    "config.not_loaded": "Not loaded: {path} has problems",
    "config.out_of_range": "Not loaded: {path} has values out of range",
    "config.loaded": "Loaded {path}.",
    "code.show": "Show code",
    "code.intro": ("Show code: the same run as a command and as a standalone script (the chapter's script, "
                   "corrected for today's transformers, peft and TRL)."),
    "code.cli": "Command line",
    "code.python": "Python script",
    # --- run panel -----------------------------------------------------------------------------------------------
    "run.start": "▶ Start training",
    "run.stop": "■ Stop",
    "run.progress": "Progress",
    "run.log": "Log",
    "run.log_empty": "The run's log appears here.",
    "run.loss_curve": "Loss curve",
    "run.loss_axis": "training loss",
    "run.step_axis": "optimizer step",
    "run.download": "Adapter (zip)",
    "state.idle": "Idle",
    "state.running": "Running",
    "state.stopping": "Stopping",
    "state.completed": "Finished",
    "state.stopped": "Stopped",
    "state.failed": "Failed",
    "state.interrupted": "Interrupted",
    "phase.resolving": "Finding the model",
    "phase.downloading": "Downloading",
    "phase.loading_model": "Loading the model",
    "phase.tokenizing": "Preparing the data",
    "phase.training": "Training",
    "phase.saving": "Saving the adapter",
    "phase.done": "Done",
    "progress.idle": "No run yet: press Start.",
    "progress.step": "step {step} / {total}",
    "progress.eta": "ETA {eta}",
    "progress.elapsed": "elapsed {elapsed}",
    "progress.tokens_per_s": "{n} tokens/s",
    "progress.epoch": "epoch {epoch}",
    "progress.loss": "loss {loss}",
    "result.finished": "Training finished",
    "result.stopped": "Stopped after step {step}: adapter saved",
    "result.failed": "The run failed",
    "result.interrupted": "The run was interrupted",
    "result.interrupted_message": ("The server stopped while this run was going; its checkpoints (if any) are in "
                                   "{path}."),
    "result.no_adapter": "No adapter was saved.",
    "result.run_folder": "Run folder: {path}",
    "result.adapter": "Adapter",
    "result.size": "Size",
    "result.loss": "Loss",
    "result.peak": "Peak memory",
    "result.steps": "Steps",
    "result.time": "Time",
    "result.steps_of": "{steps} of {total}",
    "result.allocated": "{gib} GiB allocated (torch)",
    "result.nvml": "{gib} GiB used (NVML)",
    "result.cpu_run": "CPU run: no GPU memory used",
    # --- VRAM gauge ----------------------------------------------------------------------------------------------
    "gauge.title": "GPU memory",
    "gauge.no_gpu": "No NVIDIA GPU found",
    "gauge.cpu_note": "Training runs on the CPU: fine for the offline demo, far too slow for a real model.",
    "gauge.gpu": "GPU {index} · {name}",
    "gauge.usage": "{used} / {total} GiB ({percent}%)",
    "gauge.run_peak": "this run's peak {gib} GiB",
    "gauge.predicted": "predicted {gib} GiB",
    "gauge.unavailable": "GPU monitor unavailable ({error})",
    # --- config summary ------------------------------------------------------------------------------------------
    "summary.checklist": "checklist {n}/{total}",
    "summary.quant": "4-bit {type}",
    "summary.double_quant": "+ double quant",
    "summary.no_quant": "no quantization",
    "summary.lora": "LoRA r{r} α{alpha} on {modules}",
    "summary.batch": "batch {batch} × accum {accum} = {effective}",
    "summary.max_length": "max length {n}",
    "summary.checkpointing_on": "checkpointing on",
    "summary.checkpointing_off": "checkpointing off",
    "summary.steps": "{n} steps",
    "summary.epochs": "{n} epochs",
    "summary.lr": "lr {lr}",
    "summary.packing": "packing",
    "summary.predicted": "predicted peak ≈ {gib} GiB",
    "summary.unreadable": "These settings cannot be read",
    "summary.fix_before": "Fix before starting",
    "problems.title": "Problems",
    # --- messages ------------------------------------------------------------------------------------------------
    "msg.started": "Run {id} started: {model} on {dataset}.",
    "msg.not_started": "Not started: {n} problem(s) in the settings, listed under Start.",
    "msg.not_started_title": "Not started: fix these settings",
    "msg.validation_failed": "Validation failed: {n} problem(s) in the settings. Each one says how to fix it.",
    "msg.one_job": ("A training run is already in progress ({model}); one run at a time uses the GPU. Wait for it "
                    "to finish or press Stop."),
    "msg.no_run": "No run is in progress.",
    "msg.stopping": "Stopping: the run ends after the current step and saves the adapter.",
    "msg.oom": ("The GPU ran out of memory. Nothing was lost: earlier checkpoints and adapters are intact, and the "
                "memory has been released. The checklist items below would help."),
    "msg.adapter_saved": "Adapter saved to {path}",
    "msg.error": "Error: {message}",
    # --- try it --------------------------------------------------------------------------------------------------
    "try.title": "Try it: base model vs base + adapter",
    "try.intro": ("Ask the same question to the base model and to the base model with your adapter, side by "
                  "side. Prompts are formatted with the same template as in training. The offline demo's base model "
                  "has random weights, so its own answers are noise: only the adapter's answers mean something "
                  "(after the full demo run it answers its 100 training prompts, e.g. \"Translate the word 'cat' "
                  "into French.\" → chat)."),
    "try.adapter": "Adapter",
    "try.refresh": "↻ Refresh",
    "try.prompt": "Prompt",
    "try.prompt_placeholder": "e.g. Translate the word 'cat' into French.",
    "try.send": "Send",
    "try.stop": "Stop",
    "try.settings": "Generation settings",
    "try.max_new_tokens": "Max new tokens",
    "try.temperature": "Temperature (0 = greedy, always the same answer)",
    "try.top_p": "Top-p",
    "try.seed": "Seed",
    "try.raw": "Send the prompt as typed (no template)",
    "try.base": "Base model",
    "try.tuned": "Base + adapter",
    "try.loading": "Loading {model} with the adapter from {path}…",
    "try.no_adapters": "No saved adapter yet: train a run first.",
    "try.pick_adapter": "Pick an adapter first.",
    "try.empty_prompt": "Type a prompt first.",
    "try.busy": "The model is busy answering another prompt. Try again when it has finished.",
    "try.training_running": ("A training run is using the GPU: Try it loads a second model and may run out of "
                             "memory. Wait for the run to finish for the safest result."),
    # --- export --------------------------------------------------------------------------------------------------
    "export.title": "Export the adapter",
    "export.adapter": "Adapter",
    "export.zip": "Download the adapter (zip)",
    "export.zip_ready": "Adapter zipped: {path} ({size})",
    "export.merge": "Merge into the base model (bf16)",
    "export.merge_dir": "Merged model folder",
    "export.merge_confirm": "I understand: merge and write the full model",
    "export.merge_warning": (
        "Merging writes a full copy of {model} ({params} billion parameters) in bf16: about {disk_gib} GiB on "
        "disk. The base model must be loaded unquantized (bf16, not 4-bit) to merge, which needs about {mem_gib} "
        "GiB of free RAM or GPU memory; memtune checks this first. The adapter was trained against the 4-bit "
        "base, so the merged model's answers can differ slightly from the ones in Try it."),
    "export.merge_warning_unknown": (
        "Merging writes a full copy of {model} in bf16 (about 2 bytes per parameter on disk) and needs the base "
        "model loaded unquantized (bf16, not 4-bit). memtune cannot tell its size here, so it cannot check the "
        "memory first."),
    "export.memory_ok": "Memory check: about {needed} GiB needed, {available} GiB free.",
    "export.memory_low": "Memory check failed: about {needed} GiB needed, only {available} GiB free.",
    "export.merging": "Merging…",
    "export.merged": "Merged model saved to {path} ({size})",
    "export.exists": "{path} already exists. Choose another folder, or allow replacing it.",
    "export.replace": "Replace an existing folder",
    "export.push_title": "Push to the Hugging Face Hub",
    "export.repo_id": "Repository (your-user-name/model-name)",
    "export.private": "Private repository",
    "export.push_adapter": "Push the adapter",
    "export.push_merged": "Push the merged model",
    "export.pushing": "Pushing to {repo}…",
    "export.pushed": "Pushed to {url}",
    "export.token_note": ("The token is read from HF_TOKEN in the environment when memtune starts; it is never "
                          "stored or logged."),
    "export.no_token": ("No Hugging Face token: pushing needs a token with write access. Create one at "
                        "https://huggingface.co/settings/tokens and start memtune with HF_TOKEN set to it."),
    "export.offline": ("The Hugging Face Hub cannot be reached (offline). Download the zip or the merged folder "
                       "and upload it from elsewhere."),
    "export.failed": "Export failed: {message}",
    # --- history -------------------------------------------------------------------------------------------------
    "history.title": "Run history",
    "history.refresh": "↻ Refresh",
    "history.empty": "No runs yet in {dir}.",
    "history.col.date": "Date",
    "history.col.name": "Run",
    "history.col.model": "Model",
    "history.col.dataset": "Dataset",
    "history.col.status": "Status",
    "history.col.final_loss": "Final loss",
    "history.col.peak": "Peak memory (GiB)",
    "history.col.duration": "Duration",
    "history.col.steps": "Steps",
    "history.col.resumable": "Resumable",
    "history.pick": "Pick a run in the table first.",
    "history.open": "Open",
    "history.settings": "Settings",
    "history.summary": "Summary",
    "history.load_settings": "Load its settings into the form",
    "history.settings_loaded": "Settings of {name} loaded into the form.",
    "history.resume": "Resume from the last checkpoint",
    "history.resuming": "Resuming {name} from {checkpoint}.",
    "history.no_checkpoint": ("{name} has no complete checkpoint to resume from (checkpoints are written when "
                              "save_strategy is steps or epoch)."),
    "history.delete": "Delete run",
    "history.delete_confirm": ("Delete {name}? Its folder, checkpoints and adapter are removed from disk. This "
                               "cannot be undone."),
    "history.delete_yes": "Yes, delete",
    "history.cancel": "Cancel",
    "history.deleted": "Deleted {path}.",
    "history.delete_running": "{name} is still running: stop it first, then delete it.",
    "history.delete_refused": "Not deleted: {message}",
    "history.status.completed": "completed",
    "history.status.stopped": "stopped",
    "history.status.failed": "failed",
    "history.status.running": "running",
    "history.status.interrupted": "interrupted",
    "history.status.unknown": "unknown",
    # --- memory prediction, fit to the GPU, measured speed, after-training tabs (ui) ----------------------------
    "tab.train": "Train",
    "unit.gib": "GiB",
    "preset.label": "Preset",
    "preset.info": "Sets only the memory and speed levers; model, data, learning rate and max length stay yours.",
    "preset.custom": "Custom mix",
    "preset.chapter.label": "Chapter recipe (as written)",
    "preset.chapter.description": ("The course chapter's QLoRA recipe exactly: fp32 upcast, batch 1 x 16, "
                                   "checkpointing, paged 8-bit AdamW. For comparison."),
    "preset.lowest_memory.label": "Lowest memory",
    "preset.lowest_memory.description": (
        "Smallest GPU footprint: no fp32 upcast, embedding in CPU memory, two 512-token packs per micro-step with "
        "checkpointing. 8B: 5.4 GiB peak, 6.9 GiB on the GPU, 7.9x the chapter's speed."),
    "preset.fastest.label": "Fastest within 24 GB",
    "preset.fastest.description": (
        "Most tokens per second within 24 GB: 8 packs (~4k tokens) per step, no checkpointing, fused kernels. 8B: "
        "~9,000 tokens/s on an H200 (40x the chapter), 23.6 GiB on the GPU."),
    "facts.memory": "Memory",
    "facts.speed": "Speed",
    "facts.saves": "saves {gib} GiB here",
    "facts.saves_nothing": "saves nothing here",
    "facts.no_estimate": "no estimate for this model",
    "speed.ratio": "{change} tokens/s with it ({on} vs {off} without)",
    "speed.step_time": ("{on} s per optimizer step with it vs {off} s without: a shorter cap trains fewer tokens "
                        "per row, so tokens/s is not the cost here"),
    "speed.source_rows": "{where} — {file}: {on} vs {off}",
    "speed.source": "source: {source}",
    "speed.where.length": "max length {n}",
    "speed.where.batch": "batch {n}",
    "speed.where.packs": "packing, {n} per micro-step",
    "speed.where.bf16_base": "bf16 base (no 4-bit)",
    "speed.fact.qlora": (
        "Measured (8B, 6 packs of 512 tokens, checkpointing): 4,418 tokens/s with the 4-bit base vs 6,170 with a "
        "bf16 base: NF4 dequantization takes ~30% of the time."),
    "speed.fact.gradient_checkpointing": (
        "Measured on the chapter's recipe (8B, 512 tokens, batch 1): ~25% slower (235 vs 315 tokens/s), and it "
        "saved no memory there."),
    "speed.fact.gradient_accumulation": (
        "Not measured on its own: accumulating adds no work per token; the speed cost is that of small "
        "micro-batches (see \"Use smaller batches\")."),
    "speed.fact.efficient_optimizer": (
        "No measurable cost: 235 tokens/s with paged_adamw_8bit vs 233 with adamw_torch (chapter's recipe, 8B)."),
    "speed.fact.bf16": "Not measured: every benchmark run used bf16.",
    "speed.fact.short_max_length": (
        "Not measured as a cost: a shorter cap means fewer tokens per row; rows past it lose their ends."),
    "speed.fact.small_batches": (
        "Measured (8B): a batch-1 micro-step of ~165 tokens took ~0.6 s, mostly fixed overhead; 16 rows packed "
        "into one micro-batch ran ~16x faster per token."),
    "speed.not_measured": "Not measured.",
    "gauge.cpu_prediction": "Predicted peak on a GPU for these settings: {gib} GiB",
    "gauge.hypothetical": "hypothetical {gib} GiB card",
    "gauge.fits_budget": "fits a {gib} GiB card (no GPU here: a prediction only)",
    "gauge.over_budget": "does not fit a {gib} GiB card: try Fit to my GPU (no GPU here: a prediction only)",
    "gauge.fits_free": "predicted peak {gib} GiB: fits in the {free} GiB free",
    "gauge.over_free": "predicted peak {gib} GiB: does not fit in the {free} GiB free; try Fit to my GPU",
    "peaks.predicted": "predicted",
    "peaks.measured": "measured",
    "peaks.allocated": "peak allocated (torch)",
    "peaks.reserved": "peak reserved (torch)",
    "peaks.nvml": "GPU memory used (NVML)",
    "peaks.not_measured_cpu": "not measured on CPU",
    "peaks.not_measured": "not measured",
    "fit.button": "Fit to my GPU",
    "fit.budget": "Hypothetical card (GiB)",
    "fit.budget_info": "No GPU here: Fit to my GPU aims at a card with this much memory.",
    "fit.gpu_free": "the {gib} GiB free on this GPU",
    "fit.hypothetical": "a hypothetical {gib} GiB card",
    "fit.no_budget": "Give the hypothetical card's memory in GiB first.",
    "fit.changed": "Fitted to {where}: predicted peak now {gib} GiB (10% kept spare). Changed:",
    "fit.unchanged": "Already fits {where}: predicted peak {gib} GiB (10% kept spare). Nothing changed.",
    "fit.failed": "Does not fit {where}:",
    "fit.unknown_model": "memtune cannot estimate {model} (its shape is unknown here):",
    "fit.on": "on",
    "fit.off": "off",
    "try.refused_training": (
        "A training run is in progress: Try it waits until it has finished (one model at a time; a second one "
        "could run out of memory). Stop the run or wait, then send again."),
    "try.done": "Done.",
    "try.stopped": "Stopped.",
    "export.busy_training": ("A training run is in progress: merge when it has finished (merging loads the full "
                             "model)."),
    "export.confirm_first": "Tick the confirmation first: merging writes a full copy of the model.",
    "export.merge_first": "There is no merged folder yet: merge first, or push the adapter.",
    "export.push": "Push to the Hub",
    "export.token": "Hugging Face token (optional)",
    "export.token_env_set": ("HF_TOKEN is set: leave this empty to use it. A token typed here is used for this push "
                             "only, never stored or logged."),
    "export.token_env_missing": ("HF_TOKEN is not set: paste a token with write access. It is used for this push "
                                 "only, never stored or logged."),
    "export.what": "What to push",
    "export.what_adapter": "the adapter",
    "export.what_merged": "the merged model",
    "history.checkpoint": "Last complete checkpoint",
    "history.message": "Message",
    "history.unreadable": "The settings of {name} cannot be read.",
    "history.yes": "yes",
    "field.long_prompts": "Over-long prompts",
    "help.long_prompts": (
        "A prompt that leaves the answer less than a quarter of max_length: truncate_middle cuts its middle "
        "(keeping the instruction and the answer header), truncate_left its start, so the answer still "
        "trains; drop skips the row when the prompt alone fills max_length (what TRL does). The preview "
        "counts each case."),
    "preview.train": "{n} of {rows} rows train",
    "preview.reason.kept": "{n} kept whole",
    "preview.reason.truncated": "{n} answer cut at max_length",
    "preview.reason.prompt_cut": "{n} prompt shortened so the answer trains",
    "preview.reason.dropped_long": "{n} dropped: the prompt alone fills max_length",
    "preview.reason.dropped_empty": "{n} dropped: empty or null",
    "preview.legend.kept": "fit",
    "preview.legend.truncated": "answer cut",
    "preview.legend.prompt_cut": "prompt shortened",
    "preview.legend.dropped_long": "dropped",
    "preview.packs": "packed into {n} sequences of up to {max_length} tokens",
    "preview.refused": "Nothing would train",
    "preview.row": "row {n} · {tokens} tokens · {what}",
    "data.upload_kept": "The dataset stays {dataset}: Start uses it, not the rejected file.",
    "fit.lengths_known": "Sized for this dataset's real rows (the longest is {n} tokens).",
    "fit.lengths_unknown": "Sized as if every row reached max_length: preview the data to size for its real rows.",
    "public.banner": ("Public mode: anyone who can reach this page can use it. Datasets come from uploads or the Hugging "
                      "Face Hub, runs stay in {root}, and trust_remote_code is off."),
    "config.trust_off": ("This configuration turns on trust_remote_code, which runs Python code shipped with {model} on this "
                         "server. It was left OFF: tick trust_remote_code yourself only if you trust the model's author."),
    "history.trust_confirm": ("{name} was trained with trust_remote_code, which runs Python code shipped with {model} on this "
                              "server. Its settings are in the form with trust_remote_code OFF and resume_from set: tick "
                              "trust_remote_code if you trust the model's author, then press Start to resume."),
    "gguf.title": "GGUF for llama.cpp, Ollama and LM Studio",
    "gguf.intro": ("Merges the adapter into its base model and writes one .gguf file per format, an Ollama Modelfile "
                   "and a README with the commands, into the run's gguf/ folder. Supported: Llama (incl. 3.x), "
                   "Mistral, Qwen2."),
    "gguf.formats": "Formats (several at once)",
    "gguf.format_f16": "f16: full quality",
    "gguf.format_bf16": "bf16: full quality, for bf16 hardware",
    "gguf.format_q8_0": "q8_0: half the size, near full quality",
    "gguf.replace": "Replace an earlier GGUF export",
    "gguf.export": "Export to GGUF",
    "gguf.commands": "Run it",
    "gguf.no_format": "Choose at least one format.",
    "gguf.plan": ("Needs about {ram} of memory and {disk} of disk ({files}); free here: {ram_free} of memory, "
                  "{disk_free} of disk. Written to {path}."),
    "gguf.not_enough": "Not enough room: {message}",
    "gguf.done": "GGUF export done in {path}: {files}",
    "facts.at_chapter": "at the chapter's 8B settings (Llama-3.1-8B): saves {gib} GiB",
    "facts.at_chapter_nothing": "at the chapter's 8B settings (Llama-3.1-8B): saves nothing",
    "preset.dropped": ("{preset}: applied without {levers}, which needs a CUDA GPU (and liger-kernel); there is "
                       "none here."),
    "model.unreachable": ("⚠ {model} is not on this machine and the Hugging Face Hub cannot be reached, so Start "
                          "would fail. Download it once while online (hf download {model}) or pick a local folder."),
    "model.not_on_hub": "⚠ The Hugging Face Hub has no model {model}: check the spelling (org/name).",
    "model.no_folder": "⚠ The folder {model} does not exist: check the path.",
    "msg.stop_now": "Second Stop: ending the training process now, without saving an adapter (complete checkpoints remain).",
    "phase.starting": "Starting the training process",
}

PT: dict[str, str] = {
    # --- página --------------------------------------------------------------------------------------------------
    "app.title": "memtune: fine-tuning com QLoRA",
    "app.tagline": "Fine-tuning com QLoRA na sua própria GPU, com o checklist de memória à sua frente.",
    "app.gpu_line": "GPU: {gpus}. Aberto com a receita do capítulo (QLoRA no Llama-3.1-8B).",
    "app.no_gpu_line": ("Nenhuma GPU CUDA aqui: aberto com a demo offline (um modelo minúsculo que aprende palavras "
                        "inglês → francês em menos de um minuto na CPU). Pressione Iniciar para experimentar."),
    "app.language": "Idioma",
    "tab.data": "1 · Modelo e dados",
    "tab.checklist": "2 · Checklist de Memória",
    "tab.training": "3 · Treinamento",
    "tab.code": "4 · Ajustes e código",
    "tab.try": "Experimentar",
    "tab.export": "Exportar",
    "tab.history": "Histórico",
    "preset.demo": "Configurações da demo offline",
    "preset.chapter": "Receita do capítulo (GPU)",
    "preset.demo_loaded": "Configurações da demo offline carregadas.",
    "preset.chapter_loaded": "Receita do capítulo carregada.",
    # --- modelo e dados ------------------------------------------------------------------------------------------
    "data.rescan": "↻ Reler o cache",
    "data.upload": "…ou envie um arquivo de dados ({types})",
    "data.preview": "Pré-visualizar os dados como serão treinados",
    "data.upload_not_used": "Arquivo enviado não utilizado",
    "data.bad_type": "{name}: o memtune lê arquivos {types}",
    "preview.format": "Formato: {format}",
    "preview.rows": "{n} linhas",
    "preview.dropped": "{n} linhas vazias descartadas",
    "preview.tokens": "tokens: mediana {median}, p95 {p95}, máx. {max}",
    "preview.over": "{n} de {rows} linhas são mais longas que max_length {max_length} e serão truncadas",
    "preview.fits": "todas as linhas cabem em max_length {max_length}",
    "preview.example": "exemplo {n}",
    "preview.prompt": "prompt (não treinado)",
    "preview.completion": "completion (treinado)",
    "preview.histogram": "histograma de comprimentos em tokens",
    "preview.cannot": "Não é possível pré-visualizar: corrija estas configurações",
    "preview.tokenizer_error": "Não foi possível carregar o tokenizer do modelo",
    "preview.data_error": "Os dados não podem ser usados como estão",
    "preview.read_error": "Não foi possível ler os dados",
    # --- checklist -----------------------------------------------------------------------------------------------
    "checklist.title": "Checklist de Memória",
    "checklist.intro": ("As sete economias de memória do capítulo, na ordem dele. Marcar uma altera as "
                        "configurações que ela controla (mostradas à direita); o resumo e o código acompanham."),
    "checklist.beyond": "Além do capítulo",
    "checklist.at_settings": "{tradeoff} Com estas configurações: {saving}.",
    "checklist.needs_readable": ("Corrija primeiro as configurações listadas no resumo; o checklist precisa de "
                                 "configurações legíveis."),
    "checklist.qlora.label": "Use QLoRA (quantização em 4 bits)",
    "checklist.qlora.tradeoff": (
        "Armazena os pesos congelados do modelo base em NF4 de 4 bits: ~4x menos memória de pesos (um modelo 8B: "
        "~15 GiB -> ~5,4 GiB com embeddings em bf16). Custa trabalho de desquantização a cada passo e um pouco "
        "de precisão."),
    "checklist.gradient_checkpointing.label": "Ative gradient checkpointing",
    "checklist.gradient_checkpointing.tradeoff": (
        "Recalcula as ativações de cada camada no backward em vez de armazená-las. Economiza a memória de "
        "ativações, que cresce com batch x comprimento (a estimativa ao lado desta caixa diz quanto, com as suas "
        "configurações); custa ~25-35% mais computação por passo."),
    "checklist.gradient_accumulation.label": "Use gradient accumulation",
    "checklist.gradient_accumulation.tradeoff": (
        "Soma os gradientes de vários micro-batches pequenos antes de cada atualização, de modo que um batch "
        "efetivo grande precisa das ativações de apenas um micro-batch. Não custa memória; micro-batches "
        "pequenos aproveitam mal a GPU."),
    "checklist.efficient_optimizer.label": "Use otimizador 8 bits ou paginado",
    "checklist.efficient_optimizer.tradeoff": (
        "Guarda os dois momentos do Adam em 8 bits (e os pagina para a RAM da CPU sob pressão): 2 bytes por "
        "parâmetro treinável em vez de 8. Com LoRA o conjunto treinável é pequeno, então a economia é de "
        "dezenas de MiB, não de GiB."),
    "checklist.bf16.label": "Use precisão bfloat16",
    "checklist.bf16.tradeoff": (
        "Calcula em brain-float de 16 bits: metade da memória de ativações do fp32 e tensor cores rápidos, com "
        "o alcance do fp32 (sem loss scaling). Requer uma GPU Ampere ou mais recente; GPUs mais antigas usam "
        "fp16."),
    "checklist.short_max_length.label": "Reduza o max_seq_length se possível",
    "checklist.short_max_length.tradeoff": (
        "Limita cada linha a 512 tokens: ativações e logits crescem linearmente com o comprimento. Linhas mais "
        "longas que o limite são truncadas, então confira antes o histograma de comprimentos em tokens."),
    "checklist.small_batches.label": "Use batches menores",
    "checklist.small_batches.tradeoff": (
        "Uma linha por micro-batch: o mínimo de memória de ativações. A acumulação mantém o batch efetivo. Custa "
        "velocidade: cada micro-passo tem um custo fixo, então batch 1 aproveita mal uma GPU grande."),
    # --- configurações: rótulos ----------------------------------------------------------------------------------
    "field.model": "Modelo (id do Hub ou pasta local)",
    "field.trust_remote_code": "Confiar em código remoto",
    "field.load_in_4bit": "Carregar o modelo base em 4 bits (QLoRA)",
    "field.bnb_4bit_quant_type": "Tipo de dado de 4 bits",
    "field.bnb_4bit_use_double_quant": "Quantização dupla",
    "field.precision": "Precisão de cálculo",
    "field.upcast_to_fp32": "Converter normas e embeddings para fp32 (a receita do capítulo)",
    "field.offload_embeddings": "Manter o embedding de entrada na memória da CPU",
    "field.expandable_segments": "Segmentos de memória CUDA expansíveis",
    "field.lora_r": "Rank r do LoRA",
    "field.lora_alpha": "Alpha do LoRA",
    "field.lora_dropout": "Dropout do LoRA",
    "field.lora_target_modules": "Módulos-alvo do LoRA",
    "field.dataset": "Dataset (id do Hub, arquivo local ou a demo)",
    "field.dataset_split": "Split",
    "field.dataset_format": "Formato das linhas",
    "field.max_length": "Comprimento máximo (tokens)",
    "field.per_device_train_batch_size": "Tamanho do micro-batch",
    "field.gradient_accumulation_steps": "Passos de acumulação",
    "field.packing": "Packing (batches sem padding)",
    "field.num_train_epochs": "Épocas",
    "field.max_steps": "Máximo de passos (-1 = usar épocas)",
    "field.learning_rate": "Taxa de aprendizado",
    "field.lr_scheduler_type": "Agenda da taxa de aprendizado",
    "field.warmup_steps": "Passos de aquecimento",
    "field.weight_decay": "Weight decay",
    "field.max_grad_norm": "Recorte de gradiente (norma máxima)",
    "field.optim": "Otimizador",
    "field.gradient_checkpointing": "Gradient checkpointing",
    "field.use_liger_kernel": "Kernels de loss fundidos (liger, só CUDA)",
    "field.seed": "Semente",
    "field.logging_steps": "Registrar a cada N passos",
    "field.save_strategy": "Salvar checkpoints",
    "field.save_steps": "Salvar a cada N passos",
    "field.output_dir": "Pasta de saída",
    "field.run_name": "Nome da execução (vazio = data e hora)",
    "field.resume_from": "Retomar da pasta de execução",
    "field.device": "Dispositivo",
    # --- configurações: ajuda ------------------------------------------------------------------------------------
    "help.model": ("Id do Hub (org/nome) ou pasta local de um LM causal. memtune/demo-tiny-llama é a demo "
                   "offline."),
    "help.trust_remote_code": "Executa código Python que vem com o modelo. Desligado, a menos que confie no autor.",
    "help.load_in_4bit": "QLoRA: armazena os pesos congelados do modelo base em 4 bits.",
    "help.bnb_4bit_quant_type": "Tipo de dado de 4 bits: nf4 ou fp4.",
    "help.bnb_4bit_use_double_quant": "Quantiza também as constantes de quantização (~0,4 bit/parâmetro a menos).",
    "help.precision": "Tipo de cálculo: bf16, fp16 ou fp32.",
    "help.upcast_to_fp32": (
        "O que prepare_model_for_kbit_training faz (a receita do capítulo): converte embeddings, normas e "
        "lm_head para float32. Custa ~4 GiB num Llama-3 8B com pouco ganho; desligado, ficam no tipo de cálculo."),
    "help.offload_embeddings": (
        "Mantém o embedding de entrada congelado (vocabulário x hidden: ~1 GiB no Llama-3 8B) na memória da CPU; "
        "só as linhas que um batch consulta vão para a GPU. Mesmos resultados. Sem efeito quando o embedding é "
        "compartilhado com a cabeça de saída (ex.: Llama-3.2 1B/3B) ou sem GPU."),
    "help.expandable_segments": (
        "Deixa o alocador CUDA do PyTorch aumentar segmentos de memória no lugar (expandable_segments) em vez de "
        "guardar muitos blocos fixos: menos memória reservada e não usada, logo um pico de GPU menor. Mesmos "
        "resultados. Só CUDA."),
    "help.lora_r": "Rank do LoRA.",
    "help.lora_alpha": "Numerador da escala do LoRA (escala = alpha / r).",
    "help.lora_dropout": "Dropout na entrada do LoRA.",
    "help.lora_target_modules": "Camadas lineares que recebem adaptadores LoRA.",
    "help.dataset": "Id de dataset do Hub, um arquivo local .jsonl/.json/.csv/.parquet/.txt, ou memtune/demo.",
    "help.dataset_split": "Split com fatiamento opcional, ex.: train[:1000].",
    "help.dataset_format": "Formato das linhas; auto o detecta pelas colunas.",
    "help.max_length": "Sequência de treino mais longa, em tokens; linhas mais longas são truncadas.",
    "help.per_device_train_batch_size": "Linhas por micro-batch.",
    "help.gradient_accumulation_steps": (
        "Micro-batches somados antes de cada passo do otimizador (batch efetivo = batch x acumulação)."),
    "help.packing": (
        "Batches sem padding: as linhas são concatenadas com position ids por linha, então nenhum cálculo vai "
        "para o padding."),
    "help.num_train_epochs": "Passagens pelos dados.",
    "help.max_steps": "Para após este número de passos do otimizador; -1 usa as épocas.",
    "help.learning_rate": "Taxa de aprendizado máxima.",
    "help.lr_scheduler_type": "Agenda da taxa de aprendizado.",
    "help.warmup_steps": "Aquecimento linear, em passos do otimizador.",
    "help.weight_decay": "Weight decay do AdamW.",
    "help.max_grad_norm": "Norma de recorte do gradiente; 0 desativa.",
    "help.optim": "Otimizador; os de 8 bits e os paginados precisam do bitsandbytes.",
    "help.gradient_checkpointing": "Recalcula as ativações no backward em vez de guardá-las.",
    "help.use_liger_kernel": (
        "Kernels Triton fundidos (liger-kernel): linear + entropia cruzada em blocos, de modo que os logits "
        "completos nunca existem. Só CUDA."),
    "help.seed": "Semente aleatória da ordem dos dados, da inicialização do LoRA e do dropout.",
    "help.logging_steps": "Registra a loss a cada N passos do otimizador.",
    "help.save_strategy": "Quando gravar checkpoints.",
    "help.save_steps": "Intervalo entre checkpoints quando save_strategy é steps.",
    "help.output_dir": "Pasta com uma subpasta por execução.",
    "help.run_name": "Nome da pasta da execução; vazio escolhe um nome com data e hora.",
    "help.resume_from": ("Uma pasta de execução a continuar a partir do seu checkpoint completo mais recente; "
                         "vazio começa do zero."),
    "help.device": "auto (CUDA se houver), cuda ou cpu.",
    # --- aba de treinamento, configurações salvas, código --------------------------------------------------------
    "training.advanced": "Avançado",
    "training.resume_placeholder": "ex.: runs/run-20260101-120000",
    "config.name": "Nome",
    "config.name_placeholder": "minha-execucao",
    "config.name_info": "Salvo como YAML em {dir}/",
    "config.save": "Salvar configurações",
    "config.saved_list": "Configurações salvas",
    "config.load": "Carregar",
    "config.give_name": "Dê um nome às configurações primeiro.",
    "config.bad_name": ("{name} não é um nome utilizável: use de 1 a 64 letras, dígitos, pontos, hífens ou "
                        "sublinhados, começando com letra ou dígito (sem barras nem espaços)."),
    "config.saved": "{path} salvo. Treine sem interface com:\n{command}",
    "config.replaced": "{path} substituído. Treine sem interface com:\n{command}",
    "config.not_saved": "Não salvo: estas configurações não podem ser lidas",
    "config.pick": "Escolha primeiro uma configuração salva.",
    "config.not_loaded": "Não carregado: {path} tem problemas",
    "config.out_of_range": "Não carregado: {path} tem valores fora dos limites",
    "config.loaded": "{path} carregado.",
    "code.show": "Mostrar código",
    "code.intro": ("Mostrar código: a mesma execução como comando e como script independente (o script do "
                   "capítulo, corrigido para as versões atuais de transformers, peft e TRL)."),
    "code.cli": "Linha de comando",
    "code.python": "Script Python",
    # --- painel de execução --------------------------------------------------------------------------------------
    "run.start": "▶ Iniciar treinamento",
    "run.stop": "■ Parar",
    "run.progress": "Progresso",
    "run.log": "Log",
    "run.log_empty": "O log da execução aparece aqui.",
    "run.loss_curve": "Curva de loss",
    "run.loss_axis": "loss de treino",
    "run.step_axis": "passo do otimizador",
    "run.download": "Adaptador (zip)",
    "state.idle": "Ocioso",
    "state.running": "Em execução",
    "state.stopping": "Parando",
    "state.completed": "Concluído",
    "state.stopped": "Parado",
    "state.failed": "Falhou",
    "state.interrupted": "Interrompido",
    "phase.resolving": "Procurando o modelo",
    "phase.downloading": "Baixando",
    "phase.loading_model": "Carregando o modelo",
    "phase.tokenizing": "Preparando os dados",
    "phase.training": "Treinando",
    "phase.saving": "Salvando o adaptador",
    "phase.done": "Pronto",
    "progress.idle": "Nenhuma execução ainda: pressione Iniciar.",
    "progress.step": "passo {step} / {total}",
    "progress.eta": "faltam {eta}",
    "progress.elapsed": "decorrido {elapsed}",
    "progress.tokens_per_s": "{n} tokens/s",
    "progress.epoch": "época {epoch}",
    "progress.loss": "loss {loss}",
    "result.finished": "Treinamento concluído",
    "result.stopped": "Parado após o passo {step}: adaptador salvo",
    "result.failed": "A execução falhou",
    "result.interrupted": "A execução foi interrompida",
    "result.interrupted_message": ("O servidor parou durante esta execução; seus checkpoints (se houver) estão em "
                                   "{path}."),
    "result.no_adapter": "Nenhum adaptador foi salvo.",
    "result.run_folder": "Pasta da execução: {path}",
    "result.adapter": "Adaptador",
    "result.size": "Tamanho",
    "result.loss": "Loss",
    "result.peak": "Pico de memória",
    "result.steps": "Passos",
    "result.time": "Tempo",
    "result.steps_of": "{steps} de {total}",
    "result.allocated": "{gib} GiB alocados (torch)",
    "result.nvml": "{gib} GiB usados (NVML)",
    "result.cpu_run": "Execução na CPU: nenhuma memória de GPU usada",
    # --- medidor de VRAM -----------------------------------------------------------------------------------------
    "gauge.title": "Memória da GPU",
    "gauge.no_gpu": "Nenhuma GPU NVIDIA encontrada",
    "gauge.cpu_note": "O treinamento roda na CPU: serve para a demo offline, lento demais para um modelo real.",
    "gauge.gpu": "GPU {index} · {name}",
    "gauge.usage": "{used} / {total} GiB ({percent}%)",
    "gauge.run_peak": "pico desta execução {gib} GiB",
    "gauge.predicted": "previsto {gib} GiB",
    "gauge.unavailable": "Monitor de GPU indisponível ({error})",
    # --- resumo das configurações --------------------------------------------------------------------------------
    "summary.checklist": "checklist {n}/{total}",
    "summary.quant": "4 bits {type}",
    "summary.double_quant": "+ quantização dupla",
    "summary.no_quant": "sem quantização",
    "summary.lora": "LoRA r{r} α{alpha} em {modules}",
    "summary.batch": "batch {batch} × acum. {accum} = {effective}",
    "summary.max_length": "comprimento máx. {n}",
    "summary.checkpointing_on": "checkpointing ligado",
    "summary.checkpointing_off": "checkpointing desligado",
    "summary.steps": "{n} passos",
    "summary.epochs": "{n} épocas",
    "summary.lr": "lr {lr}",
    "summary.packing": "packing",
    "summary.predicted": "pico previsto ≈ {gib} GiB",
    "summary.unreadable": "Estas configurações não podem ser lidas",
    "summary.fix_before": "Corrija antes de iniciar",
    "problems.title": "Problemas",
    # --- mensagens -----------------------------------------------------------------------------------------------
    "msg.started": "Execução {id} iniciada: {model} em {dataset}.",
    "msg.not_started": "Não iniciado: {n} problema(s) nas configurações, listados abaixo de Iniciar.",
    "msg.not_started_title": "Não iniciado: corrija estas configurações",
    "msg.validation_failed": ("A validação falhou: {n} problema(s) nas configurações. Cada um diz como "
                              "corrigi-lo."),
    "msg.one_job": ("Já há um treinamento em andamento ({model}); uma execução por vez usa a GPU. Espere ela "
                    "terminar ou pressione Parar."),
    "msg.no_run": "Nenhuma execução em andamento.",
    "msg.stopping": "Parando: a execução termina após o passo atual e salva o adaptador.",
    "msg.oom": ("A GPU ficou sem memória. Nada foi perdido: checkpoints e adaptadores anteriores estão intactos e "
                "a memória foi liberada. Os itens do checklist abaixo ajudariam."),
    "msg.adapter_saved": "Adaptador salvo em {path}",
    "msg.error": "Erro: {message}",
    # --- experimentar --------------------------------------------------------------------------------------------
    "try.title": "Experimentar: modelo base vs base + adaptador",
    "try.intro": ("Faça a mesma pergunta ao modelo base e ao modelo base com o seu adaptador, lado a lado. Os "
                  "prompts são formatados com o mesmo template do treinamento. O modelo base da demo offline tem pesos "
                  "aleatórios, então as respostas dele são ruído: só as respostas do adaptador têm significado "
                  "(depois da execução completa da demo, ele responde aos 100 prompts de treino, por exemplo "
                  "\"Translate the word 'cat' into French.\" → chat)."),
    "try.adapter": "Adaptador",
    "try.refresh": "↻ Atualizar",
    "try.prompt": "Prompt",
    "try.prompt_placeholder": "ex.: Translate the word 'cat' into French.",
    "try.send": "Enviar",
    "try.stop": "Parar",
    "try.settings": "Configurações de geração",
    "try.max_new_tokens": "Máximo de tokens novos",
    "try.temperature": "Temperatura (0 = greedy, sempre a mesma resposta)",
    "try.top_p": "Top-p",
    "try.seed": "Semente",
    "try.raw": "Enviar o prompt como digitado (sem template)",
    "try.base": "Modelo base",
    "try.tuned": "Base + adaptador",
    "try.loading": "Carregando {model} com o adaptador de {path}…",
    "try.no_adapters": "Nenhum adaptador salvo ainda: treine uma execução primeiro.",
    "try.pick_adapter": "Escolha um adaptador primeiro.",
    "try.empty_prompt": "Digite um prompt primeiro.",
    "try.busy": "O modelo está respondendo a outro prompt. Tente de novo quando ele terminar.",
    "try.training_running": ("Um treinamento está usando a GPU: Experimentar carrega um segundo modelo e pode "
                             "ficar sem memória. Espere a execução terminar para o resultado mais seguro."),
    # --- exportar ------------------------------------------------------------------------------------------------
    "export.title": "Exportar o adaptador",
    "export.adapter": "Adaptador",
    "export.zip": "Baixar o adaptador (zip)",
    "export.zip_ready": "Adaptador compactado: {path} ({size})",
    "export.merge": "Mesclar no modelo base (bf16)",
    "export.merge_dir": "Pasta do modelo mesclado",
    "export.merge_confirm": "Entendi: mesclar e gravar o modelo completo",
    "export.merge_warning": (
        "A mesclagem grava uma cópia completa de {model} ({params} bilhões de parâmetros) em bf16: cerca de "
        "{disk_gib} GiB em disco. O modelo base precisa ser carregado sem quantização (bf16, não 4 bits) para a "
        "mesclagem, o que exige cerca de {mem_gib} GiB livres de RAM ou de memória da GPU; o memtune verifica "
        "isso antes. O adaptador foi treinado sobre a base em 4 bits, então as respostas do modelo mesclado "
        "podem diferir um pouco das de Experimentar."),
    "export.merge_warning_unknown": (
        "A mesclagem grava uma cópia completa de {model} em bf16 (cerca de 2 bytes por parâmetro em disco) e "
        "exige o modelo base carregado sem quantização (bf16, não 4 bits). O memtune não consegue saber o "
        "tamanho dele aqui, então não pode verificar a memória antes."),
    "export.memory_ok": "Verificação de memória: cerca de {needed} GiB necessários, {available} GiB livres.",
    "export.memory_low": ("Verificação de memória falhou: cerca de {needed} GiB necessários, apenas {available} "
                          "GiB livres."),
    "export.merging": "Mesclando…",
    "export.merged": "Modelo mesclado salvo em {path} ({size})",
    "export.exists": "{path} já existe. Escolha outra pasta ou permita substituí-la.",
    "export.replace": "Substituir uma pasta existente",
    "export.push_title": "Enviar para o Hugging Face Hub",
    "export.repo_id": "Repositório (seu-usuario/nome-do-modelo)",
    "export.private": "Repositório privado",
    "export.push_adapter": "Enviar o adaptador",
    "export.push_merged": "Enviar o modelo mesclado",
    "export.pushing": "Enviando para {repo}…",
    "export.pushed": "Enviado para {url}",
    "export.token_note": ("O token é lido de HF_TOKEN no ambiente quando o memtune inicia; nunca é armazenado "
                          "nem registrado."),
    "export.no_token": ("Nenhum token do Hugging Face: o envio precisa de um token com permissão de escrita. "
                        "Crie um em https://huggingface.co/settings/tokens e inicie o memtune com HF_TOKEN "
                        "definido."),
    "export.offline": ("O Hugging Face Hub não está acessível (offline). Baixe o zip ou a pasta mesclada e "
                       "envie de outro lugar."),
    "export.failed": "A exportação falhou: {message}",
    # --- histórico -----------------------------------------------------------------------------------------------
    "history.title": "Histórico de execuções",
    "history.refresh": "↻ Atualizar",
    "history.empty": "Nenhuma execução ainda em {dir}.",
    "history.col.date": "Data",
    "history.col.name": "Execução",
    "history.col.model": "Modelo",
    "history.col.dataset": "Dataset",
    "history.col.status": "Estado",
    "history.col.final_loss": "Loss final",
    "history.col.peak": "Pico de memória (GiB)",
    "history.col.duration": "Duração",
    "history.col.steps": "Passos",
    "history.col.resumable": "Retomável",
    "history.pick": "Escolha primeiro uma execução na tabela.",
    "history.open": "Abrir",
    "history.settings": "Configurações",
    "history.summary": "Resumo",
    "history.load_settings": "Carregar as configurações no formulário",
    "history.settings_loaded": "Configurações de {name} carregadas no formulário.",
    "history.resume": "Retomar do último checkpoint",
    "history.resuming": "Retomando {name} a partir de {checkpoint}.",
    "history.no_checkpoint": ("{name} não tem checkpoint completo para retomar (checkpoints são gravados quando "
                              "save_strategy é steps ou epoch)."),
    "history.delete": "Excluir execução",
    "history.delete_confirm": ("Excluir {name}? A pasta, os checkpoints e o adaptador serão removidos do disco. "
                               "Isso não pode ser desfeito."),
    "history.delete_yes": "Sim, excluir",
    "history.cancel": "Cancelar",
    "history.deleted": "{path} excluído.",
    "history.delete_running": "{name} ainda está em execução: pare-a primeiro e depois exclua.",
    "history.delete_refused": "Não excluído: {message}",
    "history.status.completed": "concluída",
    "history.status.stopped": "parada",
    "history.status.failed": "falhou",
    "history.status.running": "em execução",
    "history.status.interrupted": "interrompida",
    "history.status.unknown": "desconhecido",
    # --- previsão de memória, ajuste à GPU, velocidade medida, abas pós-treinamento (ui) ------------------------
    "tab.train": "Treinar",
    "unit.gib": "GiB",
    "preset.label": "Predefinição",
    "preset.info": ("Altera apenas as alavancas de memória e velocidade; modelo, dados, taxa de aprendizado e "
                    "comprimento máximo continuam seus."),
    "preset.custom": "Combinação personalizada",
    "preset.chapter.label": "Receita do capítulo (como escrita)",
    "preset.chapter.description": ("A receita QLoRA do capítulo exatamente: upcast para fp32, batch 1 x 16, "
                                   "checkpointing, AdamW paginado de 8 bits. Para comparação."),
    "preset.lowest_memory.label": "Menor memória",
    "preset.lowest_memory.description": (
        "Menor ocupação da GPU: sem upcast para fp32, embedding na memória da CPU, dois pacotes de 512 tokens por "
        "micro-passo com checkpointing. 8B: pico de 5,4 GiB, 6,9 GiB na GPU, 7,9x a velocidade do capítulo."),
    "preset.fastest.label": "Mais rápido em 24 GB",
    "preset.fastest.description": (
        "Mais tokens por segundo em 24 GB: 8 pacotes (~4k tokens) por passo, sem checkpointing, kernels fundidos. "
        "8B: ~9.000 tokens/s numa H200 (40x o capítulo), 23,6 GiB na GPU."),
    "facts.memory": "Memória",
    "facts.speed": "Velocidade",
    "facts.saves": "economiza {gib} GiB aqui",
    "facts.saves_nothing": "não economiza nada aqui",
    "facts.no_estimate": "sem estimativa para este modelo",
    "speed.ratio": "{change} tokens/s com o item ({on} contra {off} sem ele)",
    "speed.step_time": ("{on} s por passo do otimizador com o item contra {off} s sem ele: um limite menor treina "
                        "menos tokens por linha, então tokens/s não é o custo aqui"),
    "speed.source_rows": "{where} — {file}: {on} contra {off}",
    "speed.source": "fonte: {source}",
    "speed.where.length": "comprimento máximo {n}",
    "speed.where.batch": "batch {n}",
    "speed.where.packs": "packing, {n} por micro-passo",
    "speed.where.bf16_base": "base em bf16 (sem 4 bits)",
    "speed.fact.qlora": (
        "Medido (8B, 6 pacotes de 512 tokens, checkpointing): 4.418 tokens/s com a base em 4 bits contra 6.170 "
        "com a base em bf16: a desquantização NF4 ocupa ~30% do tempo."),
    "speed.fact.gradient_checkpointing": (
        "Medido na receita do capítulo (8B, 512 tokens, batch 1): ~25% mais lento (235 contra 315 tokens/s), e ali "
        "não economizou memória."),
    "speed.fact.gradient_accumulation": (
        "Não medido isoladamente: acumular não acrescenta trabalho por token; o custo em velocidade é o dos "
        "micro-batches pequenos (veja \"Use batches menores\")."),
    "speed.fact.efficient_optimizer": (
        "Sem custo mensurável: 235 tokens/s com paged_adamw_8bit contra 233 com adamw_torch (receita do capítulo, "
        "8B)."),
    "speed.fact.bf16": "Não medido: todas as execuções do benchmark usaram bf16.",
    "speed.fact.short_max_length": (
        "Não medido como custo: um limite menor significa menos tokens por linha; as linhas além dele perdem o "
        "final."),
    "speed.fact.small_batches": (
        "Medido (8B): um micro-passo de batch 1 com ~165 tokens levou ~0,6 s, quase tudo custo fixo; 16 linhas "
        "empacotadas num só micro-batch foram ~16x mais rápidas por token."),
    "speed.not_measured": "Não medido.",
    "gauge.cpu_prediction": "Pico previsto numa GPU com estas configurações: {gib} GiB",
    "gauge.hypothetical": "placa hipotética de {gib} GiB",
    "gauge.fits_budget": "cabe numa placa de {gib} GiB (sem GPU aqui: apenas uma previsão)",
    "gauge.over_budget": ("não cabe numa placa de {gib} GiB: experimente Ajustar à minha GPU (sem GPU aqui: apenas "
                          "uma previsão)"),
    "gauge.fits_free": "pico previsto {gib} GiB: cabe nos {free} GiB livres",
    "gauge.over_free": "pico previsto {gib} GiB: não cabe nos {free} GiB livres; experimente Ajustar à minha GPU",
    "peaks.predicted": "previsto",
    "peaks.measured": "medido",
    "peaks.allocated": "pico alocado (torch)",
    "peaks.reserved": "pico reservado (torch)",
    "peaks.nvml": "memória da GPU usada (NVML)",
    "peaks.not_measured_cpu": "não medido na CPU",
    "peaks.not_measured": "não medido",
    "fit.button": "Ajustar à minha GPU",
    "fit.budget": "Placa hipotética (GiB)",
    "fit.budget_info": "Sem GPU aqui: Ajustar à minha GPU mira uma placa com esta memória.",
    "fit.gpu_free": "os {gib} GiB livres desta GPU",
    "fit.hypothetical": "uma placa hipotética de {gib} GiB",
    "fit.no_budget": "Informe primeiro a memória da placa hipotética em GiB.",
    "fit.changed": "Ajustado a {where}: pico previsto agora {gib} GiB (10% de folga). Alterado:",
    "fit.unchanged": "Já cabe em {where}: pico previsto {gib} GiB (10% de folga). Nada foi alterado.",
    "fit.failed": "Não cabe em {where}:",
    "fit.unknown_model": "O memtune não consegue estimar {model} (a arquitetura é desconhecida aqui):",
    "fit.on": "ligado",
    "fit.off": "desligado",
    "try.refused_training": (
        "Um treinamento está em andamento: o Experimentar espera ele terminar (um modelo por vez; um segundo "
        "poderia esgotar a memória). Pare a execução ou aguarde, e envie de novo."),
    "try.done": "Pronto.",
    "try.stopped": "Parado.",
    "export.busy_training": ("Um treinamento está em andamento: faça a fusão quando ele terminar (a fusão carrega o "
                             "modelo completo)."),
    "export.confirm_first": "Marque primeiro a confirmação: a fusão grava uma cópia completa do modelo.",
    "export.merge_first": "Ainda não há pasta fundida: faça a fusão primeiro, ou publique o adaptador.",
    "export.push": "Publicar no Hub",
    "export.token": "Token do Hugging Face (opcional)",
    "export.token_env_set": ("HF_TOKEN está definido: deixe vazio para usá-lo. Um token digitado aqui é usado só "
                             "nesta publicação, nunca armazenado nem registrado."),
    "export.token_env_missing": ("HF_TOKEN não está definido: cole um token com permissão de escrita. Ele é usado "
                                 "só nesta publicação, nunca armazenado nem registrado."),
    "export.what": "O que publicar",
    "export.what_adapter": "o adaptador",
    "export.what_merged": "o modelo fundido",
    "history.checkpoint": "Último checkpoint completo",
    "history.message": "Mensagem",
    "history.unreadable": "As configurações de {name} não podem ser lidas.",
    "history.yes": "sim",
    "field.long_prompts": "Prompts longos demais",
    "help.long_prompts": (
        "Um prompt que deixa para a resposta menos de um quarto de max_length: truncate_middle corta o meio "
        "dele (mantendo a instrução e o cabeçalho da resposta), truncate_left o início, para que a resposta "
        "ainda seja treinada; drop descarta a linha quando o prompt sozinho preenche max_length (o que o TRL "
        "faz). A pré-visualização conta cada caso."),
    "preview.train": "{n} de {rows} linhas são treinadas",
    "preview.reason.kept": "{n} mantidas inteiras",
    "preview.reason.truncated": "{n} com a resposta cortada em max_length",
    "preview.reason.prompt_cut": "{n} com o prompt encurtado para que a resposta seja treinada",
    "preview.reason.dropped_long": "{n} descartadas: o prompt sozinho preenche max_length",
    "preview.reason.dropped_empty": "{n} descartadas: vazias ou nulas",
    "preview.legend.kept": "cabem",
    "preview.legend.truncated": "resposta cortada",
    "preview.legend.prompt_cut": "prompt encurtado",
    "preview.legend.dropped_long": "descartadas",
    "preview.packs": "empacotadas em {n} sequências de até {max_length} tokens",
    "preview.refused": "Nada seria treinado",
    "preview.row": "linha {n} · {tokens} tokens · {what}",
    "data.upload_kept": "O conjunto de dados continua sendo {dataset}: Iniciar usará este, não o arquivo rejeitado.",
    "fit.lengths_known": "Dimensionado para as linhas reais deste conjunto de dados (a mais longa tem {n} tokens).",
    "fit.lengths_unknown": (
        "Dimensionado como se toda linha chegasse a max_length: pré-visualize os dados para dimensionar "
        "pelas linhas reais."),
    "public.banner": ("Modo público: qualquer pessoa que alcance esta página pode usá-la. Os datasets vêm de uploads ou do "
                      "Hugging Face Hub, as execuções ficam em {root} e trust_remote_code está desligado."),
    "config.trust_off": ("Esta configuração liga trust_remote_code, que executa neste servidor código Python distribuído com "
                         "{model}. Ele foi mantido DESLIGADO: marque trust_remote_code você mesmo apenas se confiar no autor "
                         "do modelo."),
    "history.trust_confirm": ("{name} foi treinado com trust_remote_code, que executa neste servidor código Python distribuído com "
                              "{model}. As configurações estão no formulário com trust_remote_code DESLIGADO e resume_from "
                              "preenchido: marque trust_remote_code se confiar no autor do modelo e depois clique em Iniciar para "
                              "retomar."),
    "gguf.title": "GGUF para llama.cpp, Ollama e LM Studio",
    "gguf.intro": ("Mescla o adaptador ao modelo base e grava um arquivo .gguf por formato, um Modelfile do Ollama "
                   "e um README com os comandos, na pasta gguf/ da execução. Suportados: Llama (incl. 3.x), "
                   "Mistral, Qwen2."),
    "gguf.formats": "Formatos (vários de uma vez)",
    "gguf.format_f16": "f16: qualidade total",
    "gguf.format_bf16": "bf16: qualidade total, para hardware com bf16",
    "gguf.format_q8_0": "q8_0: metade do tamanho, qualidade quase total",
    "gguf.replace": "Substituir uma exportação GGUF anterior",
    "gguf.export": "Exportar para GGUF",
    "gguf.commands": "Para executar",
    "gguf.no_format": "Escolha pelo menos um formato.",
    "gguf.plan": ("Precisa de cerca de {ram} de memória e {disk} de disco ({files}); livres aqui: {ram_free} de "
                  "memória, {disk_free} de disco. Gravado em {path}."),
    "gguf.not_enough": "Espaço insuficiente: {message}",
    "gguf.done": "Exportação GGUF concluída em {path}: {files}",
    "facts.at_chapter": "nas configurações 8B do capítulo (Llama-3.1-8B): economiza {gib} GiB",
    "facts.at_chapter_nothing": "nas configurações 8B do capítulo (Llama-3.1-8B): não economiza nada",
    "preset.dropped": ("{preset}: aplicado sem {levers}, que precisa de uma GPU CUDA (e do liger-kernel); não há "
                       "nenhuma aqui."),
    "model.unreachable": ("⚠ {model} não está nesta máquina e o Hugging Face Hub não pode ser acessado, então "
                          "Iniciar falharia. Baixe-o uma vez com internet (hf download {model}) ou escolha uma pasta "
                          "local."),
    "model.not_on_hub": "⚠ O Hugging Face Hub não tem o modelo {model}: confira a grafia (org/nome).",
    "model.no_folder": "⚠ A pasta {model} não existe: confira o caminho.",
    "msg.stop_now": "Parar de novo: encerrando o processo de treino agora, sem salvar o adaptador (os checkpoints completos ficam).",
    "phase.starting": "Iniciando o processo de treino",
}

FR: dict[str, str] = {
    # --- page ----------------------------------------------------------------------------------------------------
    "app.title": "memtune : fine-tuning QLoRA",
    "app.tagline": ("Le fine-tuning QLoRA sur votre propre GPU, avec la liste de vérification de la mémoire sous "
                    "les yeux."),
    "app.gpu_line": "GPU : {gpus}. Ouvert sur la recette du chapitre (QLoRA sur Llama-3.1-8B).",
    "app.no_gpu_line": ("Pas de GPU CUDA ici : ouvert sur la démo hors ligne (un tout petit modèle qui apprend des "
                        "mots anglais → français en moins d’une minute sur le CPU). Appuyez sur Démarrer pour "
                        "l'essayer."),
    "app.language": "Langue",
    "tab.data": "1 · Modèle et données",
    "tab.checklist": "2 · Check-list mémoire",
    "tab.training": "3 · Entraînement",
    "tab.code": "4 · Réglages et code",
    "tab.try": "Essayer",
    "tab.export": "Exporter",
    "tab.history": "Historique",
    "preset.demo": "Réglages de la démo hors ligne",
    "preset.chapter": "Recette du chapitre (GPU)",
    "preset.demo_loaded": "Réglages de la démo hors ligne chargés.",
    "preset.chapter_loaded": "Recette du chapitre chargée.",
    # --- modèle et données ---------------------------------------------------------------------------------------
    "data.rescan": "↻ Relire le cache",
    "data.upload": "…ou téléversez un fichier de données ({types})",
    "data.preview": "Prévisualiser les données telles qu'elles seront entraînées",
    "data.upload_not_used": "Fichier téléversé non utilisé",
    "data.bad_type": "{name} : memtune lit les fichiers {types}",
    "preview.format": "Format : {format}",
    "preview.rows": "{n} lignes",
    "preview.dropped": "{n} lignes vides écartées",
    "preview.tokens": "tokens : médiane {median}, p95 {p95}, max {max}",
    "preview.over": "{n} lignes sur {rows} dépassent max_length {max_length} et seront tronquées",
    "preview.fits": "toutes les lignes tiennent dans max_length {max_length}",
    "preview.example": "exemple {n}",
    "preview.prompt": "prompt (non entraîné)",
    "preview.completion": "complétion (entraînée)",
    "preview.histogram": "histogramme des longueurs en tokens",
    "preview.cannot": "Prévisualisation impossible : corrigez ces réglages",
    "preview.tokenizer_error": "Le tokenizer du modèle n'a pas pu être chargé",
    "preview.data_error": "Les données ne sont pas utilisables en l'état",
    "preview.read_error": "Les données n'ont pas pu être lues",
    # --- liste de vérification -----------------------------------------------------------------------------------
    "checklist.title": "Liste de vérification de la mémoire",
    "checklist.intro": ("Les sept économies de mémoire du chapitre, dans son ordre. En cocher une modifie les "
                        "réglages qu'elle gouverne (affichés à droite) ; le résumé et le code suivent."),
    "checklist.beyond": "Au-delà du chapitre",
    "checklist.at_settings": "{tradeoff} Avec ces réglages : {saving}.",
    "checklist.needs_readable": ("Corrigez d'abord les réglages listés dans le résumé ; la liste de vérification "
                                 "a besoin de réglages lisibles."),
    "checklist.qlora.label": "Utiliser QLoRA (quantification 4 bits)",
    "checklist.qlora.tradeoff": (
        "Stocke les poids gelés du modèle de base en NF4 sur 4 bits : environ 4 fois moins de mémoire pour les "
        "poids (un modèle 8B : ~15 Gio -> ~5,4 Gio avec les embeddings en bf16). Coûte un travail de "
        "déquantification à chaque pas et un peu de précision."),
    "checklist.gradient_checkpointing.label": "Activer le checkpointing de gradient",
    "checklist.gradient_checkpointing.tradeoff": (
        "Recalcule les activations de chaque couche pendant la passe arrière au lieu de les stocker. Économise "
        "la mémoire d'activations, qui croît avec lot x longueur (l'estimation à côté de cette case indique "
        "combien avec vos réglages) ; coûte environ 25-35 % de calcul en plus par pas."),
    "checklist.gradient_accumulation.label": "Utiliser l'accumulation de gradient",
    "checklist.gradient_accumulation.tradeoff": (
        "Additionne les gradients de plusieurs petits micro-lots avant chaque mise à jour : un grand lot effectif "
        "ne demande les activations que d'un seul micro-lot. Ne coûte aucune mémoire ; de petits micro-lots "
        "exploitent mal le GPU."),
    "checklist.efficient_optimizer.label": "Utiliser un optimiseur 8 bits ou paginé",
    "checklist.efficient_optimizer.tradeoff": (
        "Garde les deux moments d'Adam sur 8 bits (et les pagine vers la RAM du CPU en cas de pression) : "
        "2 octets par paramètre entraînable au lieu de 8. Avec LoRA, l'ensemble entraînable est petit : le gain "
        "se compte en dizaines de Mio, pas en Gio."),
    "checklist.bf16.label": "Utiliser la précision bfloat16",
    "checklist.bf16.tradeoff": (
        "Calcule en brain-float 16 bits : moitié moins de mémoire d'activations qu'en fp32 et des tensor cores "
        "rapides, avec la plage de valeurs du fp32 (pas de loss scaling). Nécessite un GPU Ampere ou plus "
        "récent ; les GPU plus anciens utilisent fp16."),
    "checklist.short_max_length.label": "Réduire max_seq_length si possible",
    "checklist.short_max_length.tradeoff": (
        "Limite chaque ligne à 512 tokens : activations et logits croissent linéairement avec la longueur. Les "
        "lignes plus longues sont tronquées : vérifiez d'abord l'histogramme des longueurs en tokens."),
    "checklist.small_batches.label": "Utiliser des tailles de lot plus petites",
    "checklist.small_batches.tradeoff": (
        "Une ligne par micro-lot : le minimum de mémoire d'activations. L'accumulation conserve le lot effectif. "
        "Coûte en vitesse : chaque micro-pas a un coût fixe, donc un lot de 1 exploite mal un grand GPU."),
    # --- réglages : libellés -------------------------------------------------------------------------------------
    "field.model": "Modèle (id du Hub ou dossier local)",
    "field.trust_remote_code": "Faire confiance au code distant",
    "field.load_in_4bit": "Charger le modèle de base en 4 bits (QLoRA)",
    "field.bnb_4bit_quant_type": "Type de données 4 bits",
    "field.bnb_4bit_use_double_quant": "Double quantification",
    "field.precision": "Précision de calcul",
    "field.upcast_to_fp32": "Passer les normes et les embeddings en fp32 (la recette du chapitre)",
    "field.offload_embeddings": "Garder l'embedding d'entrée en mémoire CPU",
    "field.expandable_segments": "Segments de mémoire CUDA extensibles",
    "field.lora_r": "Rang r de LoRA",
    "field.lora_alpha": "Alpha de LoRA",
    "field.lora_dropout": "Dropout de LoRA",
    "field.lora_target_modules": "Modules ciblés par LoRA",
    "field.dataset": "Jeu de données (id du Hub, fichier local ou la démo)",
    "field.dataset_split": "Split",
    "field.dataset_format": "Format des lignes",
    "field.max_length": "Longueur maximale (tokens)",
    "field.per_device_train_batch_size": "Taille du micro-lot",
    "field.gradient_accumulation_steps": "Pas d'accumulation",
    "field.packing": "Packing (lots sans padding)",
    "field.num_train_epochs": "Époques",
    "field.max_steps": "Nombre maximal de pas (-1 = selon les époques)",
    "field.learning_rate": "Taux d'apprentissage",
    "field.lr_scheduler_type": "Planification du taux d'apprentissage",
    "field.warmup_steps": "Pas de préchauffage",
    "field.weight_decay": "Weight decay",
    "field.max_grad_norm": "Écrêtage du gradient (norme max)",
    "field.optim": "Optimiseur",
    "field.gradient_checkpointing": "Checkpointing de gradient",
    "field.use_liger_kernel": "Noyaux de perte fusionnés (liger, CUDA uniquement)",
    "field.seed": "Graine",
    "field.logging_steps": "Journaliser tous les N pas",
    "field.save_strategy": "Enregistrer des checkpoints",
    "field.save_steps": "Enregistrer tous les N pas",
    "field.output_dir": "Dossier de sortie",
    "field.run_name": "Nom de l'exécution (vide = horodatage)",
    "field.resume_from": "Reprendre depuis le dossier d'exécution",
    "field.device": "Périphérique",
    # --- réglages : aide -----------------------------------------------------------------------------------------
    "help.model": ("Id du Hub (org/nom) ou dossier local d'un LM causal. memtune/demo-tiny-llama est la démo hors "
                   "ligne."),
    "help.trust_remote_code": ("Exécute le code Python fourni avec le modèle. Désactivé sauf si vous faites "
                               "confiance à son auteur."),
    "help.load_in_4bit": "QLoRA : stocke les poids gelés du modèle de base sur 4 bits.",
    "help.bnb_4bit_quant_type": "Type de données 4 bits : nf4 ou fp4.",
    "help.bnb_4bit_use_double_quant": "Quantifie aussi les constantes de quantification (~0,4 bit/paramètre gagné).",
    "help.precision": "Type de calcul : bf16, fp16 ou fp32.",
    "help.upcast_to_fp32": (
        "Ce que fait prepare_model_for_kbit_training (la recette du chapitre) : passe les embeddings, les normes "
        "et lm_head en float32. Coûte ~4 Gio sur un Llama-3 8B pour peu de gain ; désactivé, ils restent dans "
        "le type de calcul."),
    "help.offload_embeddings": (
        "Garde l'embedding d'entrée gelé (vocabulaire x hidden : ~1 Gio sur Llama-3 8B) en mémoire CPU ; seules "
        "les lignes lues par un lot vont sur le GPU. Mêmes résultats. Sans effet quand l'embedding est partagé "
        "avec la tête de sortie (p. ex. Llama-3.2 1B/3B) ou sans GPU."),
    "help.expandable_segments": (
        "Laisse l'allocateur CUDA de PyTorch agrandir les segments de mémoire sur place (expandable_segments) au "
        "lieu de garder de nombreux blocs fixes : moins de mémoire réservée mais inutilisée, donc un pic GPU plus "
        "bas. Mêmes résultats. CUDA uniquement."),
    "help.lora_r": "Rang de LoRA.",
    "help.lora_alpha": "Numérateur de l'échelle de LoRA (échelle = alpha / r).",
    "help.lora_dropout": "Dropout sur l'entrée de LoRA.",
    "help.lora_target_modules": "Couches linéaires qui reçoivent des adaptateurs LoRA.",
    "help.dataset": ("Id d'un jeu de données du Hub, un fichier local .jsonl/.json/.csv/.parquet/.txt, ou "
                     "memtune/demo."),
    "help.dataset_split": "Split avec découpage facultatif, p. ex. train[:1000].",
    "help.dataset_format": "Format des lignes ; auto le détecte d'après les colonnes.",
    "help.max_length": "Séquence d'entraînement la plus longue, en tokens ; les lignes plus longues sont tronquées.",
    "help.per_device_train_batch_size": "Lignes par micro-lot.",
    "help.gradient_accumulation_steps": (
        "Micro-lots additionnés avant chaque pas de l'optimiseur (lot effectif = lot x accumulation)."),
    "help.packing": (
        "Lots sans padding : les lignes sont concaténées avec des position ids par ligne, donc aucun calcul "
        "n'est perdu en padding."),
    "help.num_train_epochs": "Passages sur les données.",
    "help.max_steps": "S'arrête après ce nombre de pas de l'optimiseur ; -1 utilise les époques.",
    "help.learning_rate": "Taux d'apprentissage maximal.",
    "help.lr_scheduler_type": "Planification du taux d'apprentissage.",
    "help.warmup_steps": "Préchauffage linéaire, en pas de l'optimiseur.",
    "help.weight_decay": "Weight decay d'AdamW.",
    "help.max_grad_norm": "Norme d'écrêtage du gradient ; 0 le désactive.",
    "help.optim": "Optimiseur ; les versions 8 bits et paginées nécessitent bitsandbytes.",
    "help.gradient_checkpointing": "Recalcule les activations pendant la passe arrière au lieu de les garder.",
    "help.use_liger_kernel": (
        "Noyaux Triton fusionnés (liger-kernel) : linéaire + entropie croisée par blocs, si bien que les logits "
        "complets n'existent jamais. CUDA uniquement."),
    "help.seed": "Graine aléatoire pour l'ordre des données, l'initialisation de LoRA et le dropout.",
    "help.logging_steps": "Journalise la perte tous les N pas de l'optimiseur.",
    "help.save_strategy": "Quand écrire des checkpoints.",
    "help.save_steps": "Intervalle entre checkpoints quand save_strategy vaut steps.",
    "help.output_dir": "Dossier contenant un sous-dossier par exécution.",
    "help.run_name": "Nom du dossier de l'exécution ; vide choisit un nom horodaté.",
    "help.resume_from": ("Un dossier d'exécution à poursuivre depuis son checkpoint complet le plus récent ; vide "
                         "repart de zéro."),
    "help.device": "auto (CUDA si présent), cuda ou cpu.",
    # --- onglet entraînement, réglages enregistrés, code ---------------------------------------------------------
    "training.advanced": "Avancé",
    "training.resume_placeholder": "p. ex. runs/run-20260101-120000",
    "config.name": "Nom",
    "config.name_placeholder": "mon-execution",
    "config.name_info": "Enregistré en YAML dans {dir}/",
    "config.save": "Enregistrer les réglages",
    "config.saved_list": "Réglages enregistrés",
    "config.load": "Charger",
    "config.give_name": "Donnez d'abord un nom aux réglages.",
    "config.bad_name": ("{name} n'est pas un nom utilisable : utilisez de 1 à 64 lettres, chiffres, points, tirets "
                        "ou soulignés, en commençant par une lettre ou un chiffre (ni barres obliques ni "
                        "espaces)."),
    "config.saved": "{path} enregistré. Entraînez-le sans interface avec :\n{command}",
    "config.replaced": "{path} remplacé. Entraînez-le sans interface avec :\n{command}",
    "config.not_saved": "Non enregistré : ces réglages ne peuvent pas être lus",
    "config.pick": "Choisissez d'abord une configuration enregistrée.",
    "config.not_loaded": "Non chargé : {path} pose problème",
    "config.out_of_range": "Non chargé : {path} contient des valeurs hors limites",
    "config.loaded": "{path} chargé.",
    "code.show": "Afficher le code",
    "code.intro": ("Afficher le code : la même exécution en commande et en script autonome (le script du "
                   "chapitre, corrigé pour les versions actuelles de transformers, peft et TRL)."),
    "code.cli": "Ligne de commande",
    "code.python": "Script Python",
    # --- panneau d'exécution -------------------------------------------------------------------------------------
    "run.start": "▶ Démarrer l'entraînement",
    "run.stop": "■ Arrêter",
    "run.progress": "Progression",
    "run.log": "Journal",
    "run.log_empty": "Le journal de l'exécution s'affiche ici.",
    "run.loss_curve": "Courbe de perte",
    "run.loss_axis": "perte d'entraînement",
    "run.step_axis": "pas de l'optimiseur",
    "run.download": "Adaptateur (zip)",
    "state.idle": "Inactif",
    "state.running": "En cours",
    "state.stopping": "Arrêt en cours",
    "state.completed": "Terminé",
    "state.stopped": "Arrêté",
    "state.failed": "Échec",
    "state.interrupted": "Interrompu",
    "phase.resolving": "Recherche du modèle",
    "phase.downloading": "Téléchargement",
    "phase.loading_model": "Chargement du modèle",
    "phase.tokenizing": "Préparation des données",
    "phase.training": "Entraînement",
    "phase.saving": "Enregistrement de l'adaptateur",
    "phase.done": "Terminé",
    "progress.idle": "Aucune exécution pour l'instant : appuyez sur Démarrer.",
    "progress.step": "pas {step} / {total}",
    "progress.eta": "reste {eta}",
    "progress.elapsed": "écoulé {elapsed}",
    "progress.tokens_per_s": "{n} tokens/s",
    "progress.epoch": "époque {epoch}",
    "progress.loss": "perte {loss}",
    "result.finished": "Entraînement terminé",
    "result.stopped": "Arrêté après le pas {step} : adaptateur enregistré",
    "result.failed": "L'exécution a échoué",
    "result.interrupted": "L'exécution a été interrompue",
    "result.interrupted_message": ("Le serveur s'est arrêté pendant cette exécution ; ses checkpoints (s'il y en "
                                   "a) sont dans {path}."),
    "result.no_adapter": "Aucun adaptateur n'a été enregistré.",
    "result.run_folder": "Dossier de l'exécution : {path}",
    "result.adapter": "Adaptateur",
    "result.size": "Taille",
    "result.loss": "Perte",
    "result.peak": "Pic de mémoire",
    "result.steps": "Pas",
    "result.time": "Durée",
    "result.steps_of": "{steps} sur {total}",
    "result.allocated": "{gib} Gio alloués (torch)",
    "result.nvml": "{gib} Gio utilisés (NVML)",
    "result.cpu_run": "Exécution sur CPU : aucune mémoire GPU utilisée",
    # --- jauge de VRAM -------------------------------------------------------------------------------------------
    "gauge.title": "Mémoire du GPU",
    "gauge.no_gpu": "Aucun GPU NVIDIA trouvé",
    "gauge.cpu_note": ("L'entraînement tourne sur le CPU : suffisant pour la démo hors ligne, beaucoup trop lent "
                       "pour un vrai modèle."),
    "gauge.gpu": "GPU {index} · {name}",
    "gauge.usage": "{used} / {total} Gio ({percent} %)",
    "gauge.run_peak": "pic de cette exécution {gib} Gio",
    "gauge.predicted": "prévu {gib} Gio",
    "gauge.unavailable": "Surveillance du GPU indisponible ({error})",
    # --- résumé des réglages -------------------------------------------------------------------------------------
    "summary.checklist": "liste {n}/{total}",
    "summary.quant": "4 bits {type}",
    "summary.double_quant": "+ double quantification",
    "summary.no_quant": "sans quantification",
    "summary.lora": "LoRA r{r} α{alpha} sur {modules}",
    "summary.batch": "lot {batch} × accum. {accum} = {effective}",
    "summary.max_length": "longueur max {n}",
    "summary.checkpointing_on": "checkpointing activé",
    "summary.checkpointing_off": "checkpointing désactivé",
    "summary.steps": "{n} pas",
    "summary.epochs": "{n} époques",
    "summary.lr": "lr {lr}",
    "summary.packing": "packing",
    "summary.predicted": "pic prévu ≈ {gib} Gio",
    "summary.unreadable": "Ces réglages ne peuvent pas être lus",
    "summary.fix_before": "À corriger avant de démarrer",
    "problems.title": "Problèmes",
    # --- messages ------------------------------------------------------------------------------------------------
    "msg.started": "Exécution {id} démarrée : {model} sur {dataset}.",
    "msg.not_started": "Non démarré : {n} problème(s) dans les réglages, listés sous Démarrer.",
    "msg.not_started_title": "Non démarré : corrigez ces réglages",
    "msg.validation_failed": ("La validation a échoué : {n} problème(s) dans les réglages. Chacun indique comment "
                              "le corriger."),
    "msg.one_job": ("Un entraînement est déjà en cours ({model}) ; une seule exécution à la fois utilise le GPU. "
                    "Attendez qu'il se termine ou appuyez sur Arrêter."),
    "msg.no_run": "Aucune exécution en cours.",
    "msg.stopping": "Arrêt : l'exécution se termine après le pas en cours et enregistre l'adaptateur.",
    "msg.oom": ("Le GPU n'a plus de mémoire. Rien n'est perdu : les checkpoints et adaptateurs précédents sont "
                "intacts et la mémoire a été libérée. Les éléments de la liste ci-dessous aideraient."),
    "msg.adapter_saved": "Adaptateur enregistré dans {path}",
    "msg.error": "Erreur : {message}",
    # --- essayer -------------------------------------------------------------------------------------------------
    "try.title": "Essayer : modèle de base vs base + adaptateur",
    "try.intro": ("Posez la même question au modèle de base et au modèle de base avec votre adaptateur, côte à "
                  "côte. Les prompts sont formatés avec le même modèle de prompt qu'à l'entraînement. Le modèle de base "
                  "de la démo hors ligne a des poids aléatoires : ses propres réponses sont du bruit, seules celles de "
                  "l'adaptateur ont un sens (après l'exécution complète de la démo, il répond à ses 100 prompts "
                  "d'entraînement, par exemple « Translate the word 'cat' into French. » → chat)."),
    "try.adapter": "Adaptateur",
    "try.refresh": "↻ Actualiser",
    "try.prompt": "Prompt",
    "try.prompt_placeholder": "p. ex. Translate the word 'cat' into French.",
    "try.send": "Envoyer",
    "try.stop": "Arrêter",
    "try.settings": "Réglages de génération",
    "try.max_new_tokens": "Nombre max de nouveaux tokens",
    "try.temperature": "Température (0 = glouton, toujours la même réponse)",
    "try.top_p": "Top-p",
    "try.seed": "Graine",
    "try.raw": "Envoyer le prompt tel quel (sans modèle de prompt)",
    "try.base": "Modèle de base",
    "try.tuned": "Base + adaptateur",
    "try.loading": "Chargement de {model} avec l'adaptateur de {path}…",
    "try.no_adapters": "Aucun adaptateur enregistré : entraînez d'abord une exécution.",
    "try.pick_adapter": "Choisissez d'abord un adaptateur.",
    "try.empty_prompt": "Saisissez d'abord un prompt.",
    "try.busy": "Le modèle répond à un autre prompt. Réessayez quand il aura fini.",
    "try.training_running": ("Un entraînement utilise le GPU : Essayer charge un second modèle et peut manquer "
                             "de mémoire. Attendez la fin de l'exécution pour plus de sûreté."),
    # --- exporter ------------------------------------------------------------------------------------------------
    "export.title": "Exporter l'adaptateur",
    "export.adapter": "Adaptateur",
    "export.zip": "Télécharger l'adaptateur (zip)",
    "export.zip_ready": "Adaptateur compressé : {path} ({size})",
    "export.merge": "Fusionner dans le modèle de base (bf16)",
    "export.merge_dir": "Dossier du modèle fusionné",
    "export.merge_confirm": "J'ai compris : fusionner et écrire le modèle complet",
    "export.merge_warning": (
        "La fusion écrit une copie complète de {model} ({params} milliards de paramètres) en bf16 : environ "
        "{disk_gib} Gio sur le disque. Le modèle de base doit être chargé sans quantification (bf16, pas 4 bits) "
        "pour la fusion, ce qui demande environ {mem_gib} Gio de RAM ou de mémoire GPU libre ; memtune le "
        "vérifie d'abord. L'adaptateur a été entraîné sur la base en 4 bits : les réponses du modèle fusionné "
        "peuvent différer légèrement de celles d'Essayer."),
    "export.merge_warning_unknown": (
        "La fusion écrit une copie complète de {model} en bf16 (environ 2 octets par paramètre sur le disque) et "
        "demande le modèle de base chargé sans quantification (bf16, pas 4 bits). memtune ne peut pas connaître "
        "sa taille ici, donc ne peut pas vérifier la mémoire d'abord."),
    "export.memory_ok": "Vérification de la mémoire : environ {needed} Gio nécessaires, {available} Gio libres.",
    "export.memory_low": ("Vérification de la mémoire échouée : environ {needed} Gio nécessaires, seulement "
                          "{available} Gio libres."),
    "export.merging": "Fusion en cours…",
    "export.merged": "Modèle fusionné enregistré dans {path} ({size})",
    "export.exists": "{path} existe déjà. Choisissez un autre dossier ou autorisez son remplacement.",
    "export.replace": "Remplacer un dossier existant",
    "export.push_title": "Publier sur le Hugging Face Hub",
    "export.repo_id": "Dépôt (votre-nom/nom-du-modele)",
    "export.private": "Dépôt privé",
    "export.push_adapter": "Publier l'adaptateur",
    "export.push_merged": "Publier le modèle fusionné",
    "export.pushing": "Publication sur {repo}…",
    "export.pushed": "Publié sur {url}",
    "export.token_note": ("Le jeton est lu dans HF_TOKEN au démarrage de memtune ; il n'est jamais enregistré ni "
                          "journalisé."),
    "export.no_token": ("Pas de jeton Hugging Face : la publication demande un jeton avec droit d'écriture. "
                        "Créez-en un sur https://huggingface.co/settings/tokens et démarrez memtune avec "
                        "HF_TOKEN défini."),
    "export.offline": ("Le Hugging Face Hub est injoignable (hors ligne). Téléchargez le zip ou le dossier "
                       "fusionné et publiez-le depuis une autre machine."),
    "export.failed": "L'export a échoué : {message}",
    # --- historique ----------------------------------------------------------------------------------------------
    "history.title": "Historique des exécutions",
    "history.refresh": "↻ Actualiser",
    "history.empty": "Aucune exécution pour l'instant dans {dir}.",
    "history.col.date": "Date",
    "history.col.name": "Exécution",
    "history.col.model": "Modèle",
    "history.col.dataset": "Jeu de données",
    "history.col.status": "État",
    "history.col.final_loss": "Perte finale",
    "history.col.peak": "Pic de mémoire (Gio)",
    "history.col.duration": "Durée",
    "history.col.steps": "Pas",
    "history.col.resumable": "Reprenable",
    "history.pick": "Choisissez d'abord une exécution dans le tableau.",
    "history.open": "Ouvrir",
    "history.settings": "Réglages",
    "history.summary": "Résumé",
    "history.load_settings": "Charger ses réglages dans le formulaire",
    "history.settings_loaded": "Réglages de {name} chargés dans le formulaire.",
    "history.resume": "Reprendre depuis le dernier checkpoint",
    "history.resuming": "Reprise de {name} depuis {checkpoint}.",
    "history.no_checkpoint": ("{name} n'a aucun checkpoint complet d'où reprendre (les checkpoints sont écrits "
                              "quand save_strategy vaut steps ou epoch)."),
    "history.delete": "Supprimer l'exécution",
    "history.delete_confirm": ("Supprimer {name} ? Son dossier, ses checkpoints et son adaptateur seront effacés "
                               "du disque. Cette action est irréversible."),
    "history.delete_yes": "Oui, supprimer",
    "history.cancel": "Annuler",
    "history.deleted": "{path} supprimé.",
    "history.delete_running": "{name} est encore en cours : arrêtez-la d'abord, puis supprimez-la.",
    "history.delete_refused": "Non supprimé : {message}",
    "history.status.completed": "terminée",
    "history.status.stopped": "arrêtée",
    "history.status.failed": "échouée",
    "history.status.running": "en cours",
    "history.status.interrupted": "interrompue",
    "history.status.unknown": "inconnu",
    # --- prévision de mémoire, ajustement au GPU, vitesse mesurée, onglets après l'entraînement (ui) ------------
    "tab.train": "Entraîner",
    "unit.gib": "Gio",
    "preset.label": "Préréglage",
    "preset.info": ("Ne change que les leviers de mémoire et de vitesse ; modèle, données, taux d'apprentissage et "
                    "longueur maximale restent les vôtres."),
    "preset.custom": "Mélange personnalisé",
    "preset.chapter.label": "Recette du chapitre (telle qu'écrite)",
    "preset.chapter.description": ("La recette QLoRA du chapitre à l'identique : conversion en fp32, lot 1 x 16, "
                                   "checkpointing, AdamW 8 bits paginé. Pour comparaison."),
    "preset.lowest_memory.label": "Mémoire minimale",
    "preset.lowest_memory.description": (
        "La plus petite empreinte GPU : pas de conversion en fp32, embedding en mémoire CPU, deux paquets de 512 "
        "tokens par micro-pas avec checkpointing. 8B : pic de 5,4 Gio, 6,9 Gio sur le GPU, 7,9x la vitesse du "
        "chapitre."),
    "preset.fastest.label": "Le plus rapide en 24 Go",
    "preset.fastest.description": (
        "Le plus de tokens par seconde en 24 Go : 8 paquets (~4k tokens) par pas, sans checkpointing, noyaux "
        "fusionnés. 8B : ~9 000 tokens/s sur une H200 (40x le chapitre), 23,6 Gio sur le GPU."),
    "facts.memory": "Mémoire",
    "facts.speed": "Vitesse",
    "facts.saves": "économise {gib} Gio ici",
    "facts.saves_nothing": "n'économise rien ici",
    "facts.no_estimate": "pas d'estimation pour ce modèle",
    "speed.ratio": "{change} tokens/s avec ({on} contre {off} sans)",
    "speed.step_time": ("{on} s par pas d'optimisation avec contre {off} s sans : une limite plus courte entraîne "
                        "moins de tokens par ligne, donc les tokens/s ne sont pas le coût ici"),
    "speed.source_rows": "{where} — {file} : {on} contre {off}",
    "speed.source": "source : {source}",
    "speed.where.length": "longueur maximale {n}",
    "speed.where.batch": "lot de {n}",
    "speed.where.packs": "packing, {n} par micro-pas",
    "speed.where.bf16_base": "base en bf16 (sans 4 bits)",
    "speed.fact.qlora": (
        "Mesuré (8B, 6 paquets de 512 tokens, checkpointing) : 4 418 tokens/s avec la base en 4 bits contre 6 170 "
        "avec une base en bf16 : la déquantification NF4 prend ~30 % du temps."),
    "speed.fact.gradient_checkpointing": (
        "Mesuré sur la recette du chapitre (8B, 512 tokens, lot de 1) : ~25 % plus lent (235 contre 315 tokens/s), "
        "et aucune mémoire économisée dans ce cas."),
    "speed.fact.gradient_accumulation": (
        "Pas mesuré seul : accumuler n'ajoute aucun travail par token ; le coût en vitesse est celui des petits "
        "micro-lots (voir « Utiliser des tailles de lot plus petites »)."),
    "speed.fact.efficient_optimizer": (
        "Aucun coût mesurable : 235 tokens/s avec paged_adamw_8bit contre 233 avec adamw_torch (recette du "
        "chapitre, 8B)."),
    "speed.fact.bf16": "Pas mesuré : toutes les exécutions du benchmark utilisaient bf16.",
    "speed.fact.short_max_length": (
        "Pas mesuré comme un coût : une limite plus courte signifie moins de tokens par ligne ; les lignes plus "
        "longues perdent leur fin."),
    "speed.fact.small_batches": (
        "Mesuré (8B) : un micro-pas de lot 1 d'environ 165 tokens prenait ~0,6 s, surtout du coût fixe ; 16 lignes "
        "regroupées en un seul micro-lot allaient ~16x plus vite par token."),
    "speed.not_measured": "Pas mesuré.",
    "gauge.cpu_prediction": "Pic prévu sur un GPU pour ces réglages : {gib} Gio",
    "gauge.hypothetical": "carte hypothétique de {gib} Gio",
    "gauge.fits_budget": "tient sur une carte de {gib} Gio (pas de GPU ici : une prévision seulement)",
    "gauge.over_budget": ("ne tient pas sur une carte de {gib} Gio : essayez Ajuster à mon GPU (pas de GPU ici : une "
                          "prévision seulement)"),
    "gauge.fits_free": "pic prévu {gib} Gio : tient dans les {free} Gio libres",
    "gauge.over_free": "pic prévu {gib} Gio : ne tient pas dans les {free} Gio libres ; essayez Ajuster à mon GPU",
    "peaks.predicted": "prévu",
    "peaks.measured": "mesuré",
    "peaks.allocated": "pic alloué (torch)",
    "peaks.reserved": "pic réservé (torch)",
    "peaks.nvml": "mémoire GPU utilisée (NVML)",
    "peaks.not_measured_cpu": "non mesuré sur CPU",
    "peaks.not_measured": "non mesuré",
    "fit.button": "Ajuster à mon GPU",
    "fit.budget": "Carte hypothétique (Gio)",
    "fit.budget_info": "Pas de GPU ici : Ajuster à mon GPU vise une carte avec cette mémoire.",
    "fit.gpu_free": "les {gib} Gio libres de ce GPU",
    "fit.hypothetical": "une carte hypothétique de {gib} Gio",
    "fit.no_budget": "Indiquez d'abord la mémoire de la carte hypothétique en Gio.",
    "fit.changed": "Ajusté à {where} : pic prévu maintenant {gib} Gio (10 % de marge). Modifié :",
    "fit.unchanged": "Tient déjà dans {where} : pic prévu {gib} Gio (10 % de marge). Rien n'a changé.",
    "fit.failed": "Ne tient pas dans {where} :",
    "fit.unknown_model": "memtune ne peut pas estimer {model} (son architecture est inconnue ici) :",
    "fit.on": "activé",
    "fit.off": "désactivé",
    "try.refused_training": (
        "Un entraînement est en cours : Essayer attend qu'il se termine (un modèle à la fois ; un second pourrait "
        "manquer de mémoire). Arrêtez l'exécution ou patientez, puis renvoyez."),
    "try.done": "Terminé.",
    "try.stopped": "Arrêté.",
    "export.busy_training": ("Un entraînement est en cours : fusionnez quand il sera terminé (la fusion charge le "
                             "modèle complet)."),
    "export.confirm_first": "Cochez d'abord la confirmation : la fusion écrit une copie complète du modèle.",
    "export.merge_first": "Il n'y a pas encore de dossier fusionné : fusionnez d'abord, ou publiez l'adaptateur.",
    "export.push": "Publier sur le Hub",
    "export.token": "Jeton Hugging Face (facultatif)",
    "export.token_env_set": ("HF_TOKEN est défini : laissez vide pour l'utiliser. Un jeton saisi ici ne sert qu'à "
                             "cette publication, il n'est jamais enregistré ni journalisé."),
    "export.token_env_missing": ("HF_TOKEN n'est pas défini : collez un jeton avec droit d'écriture. Il ne sert "
                                 "qu'à cette publication, il n'est jamais enregistré ni journalisé."),
    "export.what": "Que publier",
    "export.what_adapter": "l'adaptateur",
    "export.what_merged": "le modèle fusionné",
    "history.checkpoint": "Dernier checkpoint complet",
    "history.message": "Message",
    "history.unreadable": "Les réglages de {name} ne peuvent pas être lus.",
    "history.yes": "oui",
    "field.long_prompts": "Prompts trop longs",
    "help.long_prompts": (
        "Un prompt qui laisse à la réponse moins d'un quart de max_length : truncate_middle en coupe le milieu "
        "(en gardant l'instruction et l'en-tête de la réponse), truncate_left le début, pour que la réponse soit "
        "encore entraînée ; drop écarte la ligne quand le prompt seul remplit max_length (ce que fait TRL). La "
        "prévisualisation compte chaque cas."),
    "preview.train": "{n} lignes sur {rows} sont entraînées",
    "preview.reason.kept": "{n} gardées entières",
    "preview.reason.truncated": "{n} avec la réponse coupée à max_length",
    "preview.reason.prompt_cut": "{n} avec le prompt raccourci pour que la réponse soit entraînée",
    "preview.reason.dropped_long": "{n} écartées : le prompt seul remplit max_length",
    "preview.reason.dropped_empty": "{n} écartées : vides ou nulles",
    "preview.legend.kept": "tiennent",
    "preview.legend.truncated": "réponse coupée",
    "preview.legend.prompt_cut": "prompt raccourci",
    "preview.legend.dropped_long": "écartées",
    "preview.packs": "regroupées en {n} séquences d'au plus {max_length} tokens",
    "preview.refused": "Rien ne serait entraîné",
    "preview.row": "ligne {n} · {tokens} tokens · {what}",
    "data.upload_kept": "Le jeu de données reste {dataset} : Démarrer utilise celui-ci, pas le fichier refusé.",
    "fit.lengths_known": (
        "Dimensionné pour les lignes réelles de ce jeu de données (la plus longue fait {n} tokens)."),
    "fit.lengths_unknown": (
        "Dimensionné comme si chaque ligne atteignait max_length : prévisualisez les données pour "
        "dimensionner selon leurs lignes réelles."),
    "public.banner": ("Mode public : toute personne qui atteint cette page peut l'utiliser. Les jeux de données viennent "
                      "d'envois de fichiers ou du Hugging Face Hub, les entraînements restent dans {root}, et "
                      "trust_remote_code est désactivé."),
    "config.trust_off": ("Cette configuration active trust_remote_code, qui exécute sur ce serveur du code Python fourni avec "
                         "{model}. Il a été laissé DÉSACTIVÉ : cochez trust_remote_code vous-même seulement si vous faites "
                         "confiance à l'auteur du modèle."),
    "history.trust_confirm": ("{name} a été entraîné avec trust_remote_code, qui exécute sur ce serveur du code Python fourni avec "
                              "{model}. Ses réglages sont dans le formulaire avec trust_remote_code DÉSACTIVÉ et resume_from rempli"
                              " : cochez trust_remote_code si vous faites confiance à l'auteur du modèle, puis appuyez sur Démarrer"
                              " pour reprendre."),
    "gguf.title": "GGUF pour llama.cpp, Ollama et LM Studio",
    "gguf.intro": ("Fusionne l'adaptateur dans son modèle de base et écrit un fichier .gguf par format, un Modelfile "
                   "Ollama et un README avec les commandes, dans le dossier gguf/ de l'entraînement. Pris en charge : "
                   "Llama (y compris 3.x), Mistral, Qwen2."),
    "gguf.formats": "Formats (plusieurs à la fois)",
    "gguf.format_f16": "f16 : qualité complète",
    "gguf.format_bf16": "bf16 : qualité complète, pour le matériel bf16",
    "gguf.format_q8_0": "q8_0 : moitié de la taille, qualité presque complète",
    "gguf.replace": "Remplacer un export GGUF précédent",
    "gguf.export": "Exporter en GGUF",
    "gguf.commands": "Pour l'exécuter",
    "gguf.no_format": "Choisissez au moins un format.",
    "gguf.plan": ("Il faut environ {ram} de mémoire et {disk} de disque ({files}) ; libres ici : {ram_free} de "
                  "mémoire, {disk_free} de disque. Écrit dans {path}."),
    "gguf.not_enough": "Pas assez de place : {message}",
    "gguf.done": "Export GGUF terminé dans {path} : {files}",
    "facts.at_chapter": "aux réglages 8B du chapitre (Llama-3.1-8B) : économise {gib} Gio",
    "facts.at_chapter_nothing": "aux réglages 8B du chapitre (Llama-3.1-8B) : n'économise rien",
    "preset.dropped": ("{preset} : appliqué sans {levers}, qui demande un GPU CUDA (et liger-kernel) ; il n'y en "
                       "a pas ici."),
    "model.unreachable": ("⚠ {model} n'est pas sur cette machine et le Hub Hugging Face est injoignable : Démarrer "
                          "échouerait. Téléchargez-le une fois en ligne (hf download {model}) ou choisissez un dossier "
                          "local."),
    "model.not_on_hub": "⚠ Le Hub Hugging Face n'a pas de modèle {model} : vérifiez l'orthographe (org/nom).",
    "model.no_folder": "⚠ Le dossier {model} n'existe pas : vérifiez le chemin.",
    "msg.stop_now": "Arrêter une seconde fois : le processus d'entraînement est terminé tout de suite, sans enregistrer d'adaptateur (les checkpoints complets restent).",
    "phase.starting": "Démarrage du processus d'entraînement",
}

STRINGS: dict[str, dict[str, str]] = {"en": EN, "pt": PT, "fr": FR}


class _Keep(dict):
    """format_map helper: a placeholder without a value stays visible as {name} instead of raising."""

    def __missing__(self, key: str) -> str:
        return "{" + key + "}"


def placeholders(text: str) -> set[str]:
    return {name for _, name, _, _ in string.Formatter().parse(text) if name}


def t(key: str, lang: str | None = DEFAULT_LANGUAGE, **fmt: Any) -> str:
    """The text for `key` in `lang` (falling back to English, then to the key), placeholders filled from fmt."""
    table = STRINGS.get(normalize(lang), EN)
    text = table.get(key)
    if text is None:
        text = EN.get(key, key)
    return text.format_map(_Keep(fmt)) if fmt else text


def normalize(lang: str | None) -> str:
    """'pt-BR' -> 'pt', 'FR' -> 'fr'; anything unsupported -> 'en'."""
    code = (lang or "").strip().lower().replace("_", "-").split("-", 1)[0]
    return code if code in STRINGS else DEFAULT_LANGUAGE


_TAG = re.compile(r"^\s*([A-Za-z]{1,8}(?:[-_][A-Za-z0-9]{1,8})*|\*)\s*(?:;\s*q\s*=\s*([0-9.]+))?\s*$")


def detect_language(accept_language: str | None) -> str:
    """The best of en/pt/fr for a browser's Accept-Language header ("pt-BR,pt;q=0.9,en;q=0.8"); default en."""
    best, best_q = DEFAULT_LANGUAGE, 0.0
    for order, part in enumerate((accept_language or "").split(",")):
        m = _TAG.match(part)
        if not m or m.group(1) == "*":
            continue
        try:
            q = float(m.group(2)) if m.group(2) is not None else 1.0
        except ValueError:
            continue
        code = m.group(1).lower().replace("_", "-").split("-", 1)[0]
        # Strictly greater: among equal weights the header's first language wins.
        if code in STRINGS and q > best_q and q > 0:
            best, best_q = code, q
    return best


def request_language(request: Any) -> str:
    """detect_language for a request object with .headers (gr.Request, starlette Request); en without one."""
    headers = getattr(request, "headers", None)
    if headers is None:
        return DEFAULT_LANGUAGE
    try:
        return detect_language(headers.get("accept-language"))
    except Exception:  # noqa: BLE001 - a strange request must never break the page
        return DEFAULT_LANGUAGE


def language_choices() -> list[tuple[str, str]]:
    """(name, code) pairs for a language picker."""
    return [(name, code) for code, name in LANGUAGES.items()]


def checklist_texts(lang: str) -> list[tuple[str, str, str]]:
    """(item key, label, trade-off) of the seven checklist items, in the chapter's order, in `lang`."""
    from core.checklist import ITEMS

    return [(item.key, t(f"checklist.{item.key}.label", lang), t(f"checklist.{item.key}.tradeoff", lang))
            for item in ITEMS]


def field_label(name: str, lang: str) -> str:
    return t(f"field.{name}", lang)


def field_help(name: str, lang: str) -> str:
    return t(f"help.{name}", lang)
