"""Try it: answer a prompt with the base model and with base + a saved adapter, side by side, streaming.

- `format_prompt(tokenizer, text)` formats the user's text exactly as a training prompt was formatted: it runs
  the text through core.data.formats' own row formatter (chat template when the tokenizer has one, else the default
  Alpaca-style template), so the two can never drift apart.
- `generate_stream(model, tokenizer, prompt, ...)` yields the answer so far while `model.generate` runs in a
  thread (transformers' TextIteratorStreamer). Closing the iterator (a Stop button, a closed tab) stops the
  generation at the next token.
- `Comparer` keeps ONE model in memory: the base + the adapter last asked for, loaded fresh by
  core.model.load.load_with_adapter. Another adapter means: drop the old model (del, gc, empty the CUDA cache), load a
  new base. The "base" answer comes from the same PeftModel with its adapter disabled, so LoRA layers never stack
  on a reused model and the base is the very same (quantized) weights the adapter was trained on.

The app never runs this in its own process: its Try it child (core/jobs/act.py, started by core/jobs/actions.py)
holds one `Comparer`, keeps the model loaded between prompts and streams each answer as events; a crash or an
out-of-memory kill ends that child, not the web server. A Comparer serialises its own use with a lock.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, TypeVar

from core.config.settings import ConfigError, TrainConfig
from core.config.slices import ModelSlice
from core.demo import demo_rows
from core.files import free_memory
from core.messages import HandsOn, Keyed, Said, said_again

M = TypeVar("M", bound=ModelSlice)
ADAPTER_CONFIG = "memtune.yaml"  # the TrainConfig that trained the adapter (written by core.train.recipe.save_adapter)


class InferError(HandsOn, RuntimeError):
    """The model could not answer; the message says why and what to do: an `infer.err.*` locale key and its
    parameters (core.messages.Keyed), or a message handed on whole (a Said: said(exc)), so the page says it in its
    language."""


def said(what: BaseException | str) -> Said:
    """A message to hand on to another error (ExportError, GGUFError) with its key: a Said as it is, a keyed error's
    key and parameters; anything else (a library's own words: an OSError, a transformers error) quoted as written
    (msg.text), the only English a page may then show."""
    if isinstance(what, Said):
        return what
    if isinstance(what, Keyed) and what.key:
        return said_again(what.key, what.params)
    return Said("msg.text", text=str(what))


# --- prompt formatting -------------------------------------------------------------------------------------------
def format_prompt(tokenizer: Any, user_text: str, context: str = "") -> str:
    """The prompt a training row with this instruction (and optional context) had, ready for generation.

    One dolly row goes through core.data.formats.to_sft, the function that formatted the training data, so the chat
    template (or default template), the BOS handling and any later change there apply here too.
    """
    import datasets

    from core.data.formats import to_sft
    from core.data.read import DataError

    text = (user_text or "").strip()
    if not text:
        raise InferError("infer.err.empty_prompt")
    row = datasets.Dataset.from_dict({"instruction": [text], "context": [context or ""], "response": ["-"]})
    try:
        sft = to_sft(row, "dolly", tokenizer)
    except DataError as exc:
        raise InferError(said(exc)) from None
    return sft["prompt"][0]


# --- streaming generation ----------------------------------------------------------------------------------------
StopSignal = threading.Event | Callable[[], bool] | None


def _should_stop(stop: StopSignal) -> Callable[[], bool]:
    if stop is None:
        return lambda: False
    if isinstance(stop, threading.Event):
        return stop.is_set
    return stop


def _stop_criteria(should_stop: Callable[[], bool]):
    import torch
    from transformers import StoppingCriteria, StoppingCriteriaList

    class StopFlag(StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):
            return torch.full((input_ids.shape[0],), bool(should_stop()), dtype=torch.bool,
                              device=input_ids.device)

    return StoppingCriteriaList([StopFlag()])


def generate_stream(model: Any, tokenizer: Any, prompt: Any, max_new_tokens: int = 128,
                    temperature: float = 0.0, top_p: float = 0.9, seed: int = 0,
                    stop: StopSignal = None) -> Iterator[str]:
    """Yield the generated text so far (without the prompt) as tokens arrive.

    temperature 0 decodes greedily (top_p is then unused); otherwise samples with `seed`, so the same seed gives
    the same answer. `prompt` is used as is: format it with `format_prompt` first (or the tensors a processor made
    of it: image_inputs, `tokenizer` then the processor's tokenizer). `stop` (an Event, or a
    function returning True to stop) or closing the iterator ends the generation at the next token.
    """
    import torch
    from transformers import TextIteratorStreamer

    if max_new_tokens < 1:
        raise InferError("infer.err.max_new_tokens")
    # add_special_tokens as in training (TRL adds BOS the same way)
    inputs = tokenizer(prompt, return_tensors="pt") if isinstance(prompt, str) else dict(prompt)
    device = getattr(model, "device", None) or next(model.parameters()).device
    inputs = {k: v.to(device) for k, v in inputs.items()}
    streamer = TextIteratorStreamer(tokenizer, skip_prompt=True, skip_special_tokens=True)
    flag = threading.Event()
    user_stop = _should_stop(stop)
    sample = temperature > 0
    kwargs: dict[str, Any] = dict(
        **inputs, streamer=streamer, max_new_tokens=int(max_new_tokens), do_sample=sample,
        stopping_criteria=_stop_criteria(lambda: flag.is_set() or user_stop()),
        use_cache=True,  # load_model turned the KV cache off for training
        pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    if sample:
        kwargs.update(temperature=float(temperature), top_p=float(top_p))
    else:  # silence "temperature is set but do_sample is False" from a model's own generation_config
        kwargs.update(temperature=None, top_p=None, top_k=None)
    failure: list[BaseException] = []

    def work() -> None:
        try:
            torch.manual_seed(int(seed))
            with torch.inference_mode():
                model.generate(**kwargs)
        except BaseException as exc:  # noqa: BLE001 - handed to the reading thread below
            failure.append(exc)
            streamer.end()  # unblock the reader

    thread = threading.Thread(target=work, daemon=True, name="memtune-generate")
    thread.start()
    text = ""
    try:
        for piece in streamer:
            if piece:
                text += piece
                yield text
    finally:
        flag.set()  # a no-op when generation already ended; otherwise it ends at the next token
        thread.join()
    if failure:
        exc = failure[0]
        if isinstance(exc, torch.OutOfMemoryError):
            raise InferError("infer.err.oom_generating") from None
        raise InferError("infer.err.generation", error=f"{type(exc).__name__}: {exc}") from exc


# --- base vs base + adapter --------------------------------------------------------------------------------------
def remote_code_refusal(adapter_dir: str | Path, model: str) -> InferError:
    """What a load says when the adapter's settings ask for trust_remote_code and the user has not confirmed it."""
    return InferError("infer.err.remote_code", path=str(Path(adapter_dir) / ADAPTER_CONFIG), model=model)


def adapter_config(adapter_dir: str | Path, trust_remote_code: bool | None = None) -> TrainConfig:
    """The TrainConfig an adapter was trained with (its memtune.yaml), or InferError saying what is missing.

    trust_remote_code is the user's own confirmation, never the file's: None (only reading what the adapter is)
    returns the settings with it off; False refuses (InferError) an adapter whose settings ask for it; True keeps
    it as saved. So no model is ever loaded with the model's own code because a memtune.yaml said so.
    """
    cfg = _saved_config(adapter_dir)
    if cfg.trust_remote_code and trust_remote_code is False:
        raise remote_code_refusal(adapter_dir, cfg.model)
    return cfg if trust_remote_code else cfg.replace(trust_remote_code=False)


def asks_remote_code(adapter_dir: str | Path) -> bool:
    """Whether the adapter's saved settings have trust_remote_code on (False when they cannot be read)."""
    try:
        return _saved_config(adapter_dir).trust_remote_code
    except InferError:
        return False


ADAPTER_WEIGHTS = "adapter_model.safetensors"  # what peft's save_pretrained writes (safe_serialization, its default)


def _damaged(path: Path, why: Said) -> InferError:
    """A damaged adapter file: `why` is what is wrong with it (an infer.damaged.* message)."""
    return InferError("infer.err.damaged", path=str(path), why=why)


LORA = "LORA"  # peft_type of every adapter memtune trains: DoRA and rsLoRA are options of LoRA, not types of their own


def adapter_problem(adapter_dir: str | Path, cfg: ModelSlice | None = None,
                    path: str | None = None) -> InferError | None:
    """What is wrong with an adapter folder's own files, found before any library loads them (each would otherwise
    fail with its own words: SafetensorError, JSONDecodeError, "Repo id must be...", a size-mismatch RuntimeError):
    adapter_config.json unreadable or not LoRA's (its peft_type: peft would load another type's weights silently, or
    fail inside torch), the weights file missing, not a whole safetensors file (its header and length, checked by
    safetensors itself without reading the tensors), or holding LoRA matrices of another rank than
    adapter_config.json's `r`. With `cfg` and `path` (the base model's folder, as the loader resolved it), also its
    target_modules against that model's layers (target_problem). None when the adapter is sound. Try it, merge and
    GGUF export all call it: through adapter_config, then with the base before loading it."""
    import json

    adapter_dir = Path(adapter_dir)
    config_file, weights = adapter_dir / "adapter_config.json", adapter_dir / ADAPTER_WEIGHTS
    try:
        settings = json.loads(config_file.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        return _damaged(config_file, Said("infer.damaged.json", error=str(exc)))
    except OSError as exc:
        return _damaged(config_file, Said("infer.damaged.unreadable", error=str(exc.strerror or exc)))
    kind = settings.get("peft_type") if isinstance(settings, dict) else None
    if kind is not None and kind != LORA:
        return InferError("infer.err.peft_type", path=str(config_file), type=json.dumps(kind))
    rank = settings.get("r") if isinstance(settings, dict) else None
    if not isinstance(rank, int) or isinstance(rank, bool) or rank < 1:
        return _damaged(config_file, Said("infer.damaged.no_rank"))
    if kind is None:
        return _damaged(config_file, Said("infer.damaged.no_type", type=LORA))
    if not weights.is_file():
        return InferError("infer.err.no_weights", path=str(adapter_dir), file=ADAPTER_WEIGHTS)
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(weights), framework="numpy") as sf:  # the header and the file's length; no tensor read
            shapes = {name: sf.get_slice(name).get_shape() for name in sf.keys()}
    except (SafetensorError, OSError) as exc:
        return _damaged(weights, Said("infer.damaged.safetensors", error=str(exc)))
    if not any(".lora_A." in name for name in shapes):
        return _damaged(weights, Said("infer.damaged.no_lora"))
    if not settings.get("rank_pattern"):  # one rank for every layer: each lora_A is [r, in], each lora_B [out, r]
        on_3d = parameter_modules(settings.get("target_parameters"))
        for name, shape in shapes.items():
            found = shape[0] if ".lora_A." in name else shape[-1] if ".lora_B." in name else None
            # LoRA on a 3-D experts weight (target_parameters): r rows per expert, r x experts in all
            if found is not None and len(shape) == 2 and found != rank and not (
                    found % rank == 0 and _on_parameter(name, on_3d)):
                return _damaged(weights, Said("infer.damaged.rank", name=name, found=found, rank=rank))
    if cfg is not None and path is not None:
        return target_problem(config_file, settings.get("target_modules"), cfg, path)
    return None


def parameter_modules(targets: Any) -> tuple[str, ...]:
    """The modules whose parameters adapter_config.json's target_parameters name ("mlp.experts.gate_up_proj" ->
    "mlp.experts")."""
    if not isinstance(targets, list):
        return ()
    return tuple({t.rpartition(".")[0] for t in targets if isinstance(t, str) and "." in t})


def _on_parameter(name: str, modules: tuple[str, ...]) -> bool:
    """A saved LoRA matrix of peft's ParamWrapper on one of `modules` ("...mlp.experts[.base_layer...].lora_A.weight":
    one wrapper per targeted parameter, nested)."""
    path = name.rpartition(".lora_")[0]
    while path.endswith(".base_layer"):
        path = path.removesuffix(".base_layer")
    return any(path == m or path.endswith("." + m) for m in modules)


def target_problem(config_file: Path, targets: Any, cfg: ModelSlice, path: str) -> InferError | None:
    """target_modules (adapter_config.json's) that name no linear layer of the model at `path`, matched as peft
    matches them (a name equal to a layer's path or ending it; a string: a pattern the whole path matches), said with
    the model's own layers; None when each is there. The model is built on the meta device from its config.json (the
    tree LoRA targets are resolved on: core/model/lora_targets.py), no weight read. ModelError for a model that is
    no causal LM."""
    import re

    from core.model import load as model_lib, lora_targets as lt

    if not targets or targets == "all-linear":
        return None
    tree = model_lib.skeleton(cfg, path)
    if isinstance(targets, str):
        try:
            missing = [] if any(re.fullmatch(targets, name) for name, _ in tree.named_modules()) else [targets]
        except re.error:  # not a pattern peft could match either
            missing = [targets]
    else:
        missing = [m for m in targets if not lt.paths(tree, [m])]
    if not missing:
        return None
    return InferError("infer.err.targets", path=str(config_file), modules=", ".join(missing), model=cfg.model,
                      linear=", ".join(lt.linear_layers(tree)))


def load_problem(exc: BaseException, adapter_dir: str | Path) -> InferError | None:
    """A library's error while putting a sound-looking adapter on its base, said plainly: the adapter's matrices do
    not fit the base model's layers (trained on another model, or memtune.yaml names another one)."""
    if isinstance(exc, RuntimeError) and "size mismatch" in str(exc):
        return InferError("infer.err.size_mismatch", path=str(adapter_dir))
    return None


def _saved_config(adapter_dir: str | Path) -> TrainConfig:
    adapter_dir = Path(adapter_dir)
    if not (adapter_dir / "adapter_config.json").is_file():
        raise InferError("infer.err.not_adapter", path=str(adapter_dir))
    if (problem := adapter_problem(adapter_dir)) is not None:
        raise problem
    if not (adapter_dir / ADAPTER_CONFIG).is_file():
        raise InferError("infer.err.no_settings", path=str(adapter_dir), file=ADAPTER_CONFIG)
    try:
        return TrainConfig.load(adapter_dir / ADAPTER_CONFIG)
    except ConfigError as exc:
        raise InferError("infer.err.settings_unreadable", path=str(adapter_dir / ADAPTER_CONFIG),
                         error=str(exc)) from None


def base_for(adapter_dir: Path, cfg: ModelSlice) -> str:
    """The folder of the adapter's base model, once the adapter is known to fit it (adapter_problem with the model's
    tree): what a load takes next. InferError when it does not fit; ModelError when the model cannot be found."""
    from core.model.load import resolve_model_path

    path = resolve_model_path(cfg)
    if (problem := adapter_problem(adapter_dir, cfg, path)) is not None:
        raise problem
    return path


def _runnable(cfg: M) -> M:
    """A config trained on a GPU still loads here when the GPU is gone (4-bit NF4 runs on the CPU too)."""
    import torch

    if cfg.device == "cuda" and not torch.cuda.is_available():
        return cfg.replace(device="cpu")
    return cfg


def _key(adapter_dir: Path) -> tuple[str, float]:
    # The path and the weights' mtime: a run resumed to completion rewrites the same folder with new weights.
    weights = adapter_dir / "adapter_model.safetensors"
    return str(adapter_dir.resolve()), weights.stat().st_mtime if weights.is_file() else 0.0


PROCESSOR_FILES = ("processor_config.json", "preprocessor_config.json")  # an image-text run saves its processor


def reads_images(adapter_dir: str | Path | None) -> bool:
    """Whether an adapter was trained on images (its run saved the model's processor beside it): Try it then takes an
    image. Read from the folder's file names only (the web server asks it; nothing is loaded)."""
    return bool(adapter_dir) and any((Path(adapter_dir) / name).is_file() for name in PROCESSOR_FILES)


def image_inputs(processor: Any, text: str, image: str | None) -> dict[str, Any]:
    """The question (and its image, a file path) as the run's rows were formatted (core.data.images: the processor's
    chat template, the image opened upright in RGB and resized by the processor), ready for generate_stream."""
    from core.data.images import generation_inputs, image_problems, question

    text = (text or "").strip()
    if not text:
        raise InferError("infer.err.empty_prompt")
    if image:
        problems = image_problems(str(Path(image).resolve()))
        if problems:
            raise InferError("infer.err.image", why=problems[0])
    return generation_inputs(processor, question(text, image))


@dataclass
class Loaded:
    adapter_dir: Path
    config: TrainConfig
    model: Any  # peft.PeftModel (base + this adapter)
    tokenizer: Any
    processor: Any = None  # an image-text model's (reads_images): its tokenizer is `tokenizer`


class Comparer:
    """Holds at most one base + adapter in memory and answers with and without the adapter.

    Thread-safe: one comparison (or load) at a time. The lock is a plain Lock, not an RLock, because Gradio may
    advance a generator from a different worker thread at each step, and only a plain Lock may be released by
    another thread. A caller that waits longer than `wait_s` gets an InferError instead of hanging.
    """

    def __init__(self, wait_s: float = 120.0) -> None:
        self._lock = threading.Lock()
        self._loaded: Loaded | None = None
        self._key: tuple[str, float] | None = None
        self._stop = threading.Event()
        self.wait_s = wait_s

    @property
    def adapter_dir(self) -> Path | None:
        loaded = self._loaded
        return loaded.adapter_dir if loaded else None

    def stop(self) -> None:
        """End the comparison in progress (if any) at its next token; a Stop button's handler."""
        self._stop.set()

    def _acquire(self) -> None:
        if not self._lock.acquire(timeout=self.wait_s):
            raise InferError("infer.err.busy")

    def load(self, adapter_dir: str | Path, trust_remote_code: bool = False) -> Loaded:
        """Base + adapter for `adapter_dir`: the cached one if it is the same adapter, else a fresh load.
        trust_remote_code: the user's confirmation (adapter_config)."""
        self._acquire()
        try:
            return self._load(Path(adapter_dir), trust_remote_code)
        finally:
            self._lock.release()

    def unload(self) -> None:
        """Drop the loaded model and give its memory back."""
        self._acquire()
        try:
            self._unload()
        finally:
            self._lock.release()

    def _load(self, adapter_dir: Path, trust_remote_code: bool = False) -> Loaded:
        from core.model import load as model_lib

        cfg = _runnable(adapter_config(adapter_dir, trust_remote_code=trust_remote_code))
        key = _key(adapter_dir)
        if self._loaded is not None and self._key == key:
            return self._loaded
        self._unload()  # first free the old model: two models at once may not fit
        try:
            path = base_for(adapter_dir, cfg)
            tok_src = str(adapter_dir) if (adapter_dir / "tokenizer_config.json").is_file() else path
            processor = model_lib.load_processor(cfg, str(adapter_dir)) if reads_images(adapter_dir) else None
            tokenizer = processor.tokenizer if processor is not None else model_lib.load_tokenizer(cfg, tok_src)
            peft_model = model_lib.load_with_adapter(cfg, adapter_dir, path)
        except model_lib.ModelError as exc:
            raise InferError(said(exc)) from None
        except Exception as exc:
            import torch

            if isinstance(exc, torch.OutOfMemoryError):
                _free()
                raise InferError("infer.err.oom_loading") from None
            if (problem := load_problem(exc, adapter_dir)) is not None:
                raise problem from None
            raise
        self._loaded = Loaded(adapter_dir, cfg, peft_model, tokenizer, processor)
        self._key = key
        return self._loaded

    def _unload(self) -> None:
        if self._loaded is None:
            return
        self._loaded.model = None
        self._loaded = None
        self._key = None
        _free()

    def compare(self, adapter_dir: str | Path, prompt: str, max_new_tokens: int = 128, temperature: float = 0.0,
                top_p: float = 0.9, seed: int = 0, template: bool = True,
                stop: StopSignal = None, trust_remote_code: bool = False,
                image: str | None = None) -> Iterator[tuple[str, str]]:
        """Yield (base answer so far, adapter answer so far): first the base streams, then base + adapter.

        Both use the same prompt, settings and seed, so any difference comes from the adapter. template=False
        sends the prompt as typed (for models trained on plain text). `image` (a file path): the question is about
        it, asked as an image run's rows were (image_inputs; an image-text adapter is always templated: its
        template places the image). `stop()` or the `stop` argument ends it.
        """
        self._acquire()
        self._stop.clear()
        user_stop = _should_stop(stop)

        def halted() -> bool:
            return self._stop.is_set() or user_stop()

        try:
            loaded = self._load(Path(adapter_dir), trust_remote_code)
            model, tokenizer = loaded.model, loaded.tokenizer
            if loaded.processor is not None:
                text = image_inputs(loaded.processor, prompt, image)
            elif image:
                raise InferError("infer.err.image_text_model", model=loaded.config.model)
            else:
                text = format_prompt(tokenizer, prompt) if template else prompt
                if not text.strip():
                    raise InferError("infer.err.empty_prompt")
            settings = dict(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, seed=seed,
                            stop=halted)
            base = ""
            with model.disable_adapter():  # the same weights minus LoRA: the plain base model
                for base in generate_stream(model, tokenizer, text, **settings):
                    yield base, ""
            yield base, ""  # the base answer is final even if it was empty
            if halted():
                return
            for tuned in generate_stream(model, tokenizer, text, **settings):
                yield base, tuned
        finally:
            self._lock.release()

    def answer(self, adapter_dir: str | Path, prompt: str, **settings: Any) -> tuple[str, str]:
        """Both answers at once (no streaming): (base, base + adapter)."""
        base = tuned = ""
        for base, tuned in self.compare(adapter_dir, prompt, **settings):
            pass
        return base, tuned


_free = free_memory



# --- the offline demo's score (scripts/demo_bench.py): Try it's answers to the demo's own prompts ---------------

def demo_answers(adapter_dir: str | Path, rows: list[dict[str, str]] | None = None,
                 max_new_tokens: int = 8) -> list[str]:
    """Greedy answers of base + adapter to `rows`' instructions (default: the demo's 100), as Try it asks them:
    each prompt formatted by format_prompt (the training formatter), special tokens dropped."""
    from transformers import AutoTokenizer

    from core.model.load import load_with_adapter

    cfg = _runnable(adapter_config(adapter_dir))
    model = load_with_adapter(cfg, adapter_dir, base_for(Path(adapter_dir), cfg))
    tokenizer = AutoTokenizer.from_pretrained(str(adapter_dir))  # save_adapter writes it beside the weights
    return model_answers(model, tokenizer, rows, max_new_tokens)


def model_answers(model, tokenizer, rows: list[dict[str, str]] | None = None, max_new_tokens: int = 8) -> list[str]:
    """Greedy answers of any causal LM (base + adapter, or a merged model folder loaded by transformers) to
    `rows`' instructions, prompted as Try it prompts."""
    import torch

    answers = []
    with torch.inference_mode():
        for row in demo_rows() if rows is None else rows:
            prompt = format_prompt(tokenizer, row["instruction"], row.get("context", ""))
            inputs = tokenizer(prompt, return_tensors="pt")
            out = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False, use_cache=True,
                                 temperature=None, top_p=None, top_k=None,
                                 pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
            answers.append(tokenizer.decode(out[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True))
    return answers


def count_exact(answers: list[str], rows: list[dict[str, str]] | None = None) -> int:
    """How many answers equal their row's response (surrounding spaces ignored)."""
    rows = demo_rows() if rows is None else rows
    return sum(a.strip() == r["response"].strip() for a, r in zip(answers, rows, strict=True))


def heldout_rows(plan: Any, tokenizer: Any, dataset: str, n: int) -> tuple[list[dict[str, Any]], str]:
    """(rows, source): the first `n` rows a held-out score answers, each {row, prompt_ids or prompt, reference}; the
    run's score (core/train/heldout.py) and the data preview's scorer rows (core/jobs/preview.py) both take them
    here. The plan's validation part ("validation": a held-out share, a split or validation_data), else the demo's
    own prompts as Try it asks them ("demo": its score is the n/100 the demo states), else the training rows
    ("train", said so on the card). `plan`: a DataPlan or PairPlan with its validation part. ([], "off") for n <= 0."""
    from core.config.settings import DEMO_DATASET
    from core.data.validation import samples

    if n <= 0:
        return [], "off"
    if plan.evaluates:
        return samples(plan.validation, tokenizer, n), "validation"
    if dataset.strip() == DEMO_DATASET:
        return [{"row": i, "prompt": format_prompt(tokenizer, row["instruction"], row.get("context", "")),
                 "reference": row["response"]} for i, row in enumerate(demo_rows()[:n])], "demo"
    return samples(plan, tokenizer, n), "train"


def score_adapter(adapter_dir: str | Path, rows: list[dict[str, str]] | None = None) -> tuple[int, int]:
    """(exact answers, prompts): how many of `rows` (default: the demo's 100 training prompts) the adapter answers
    exactly, greedily (surrounding spaces ignored)."""
    rows = demo_rows() if rows is None else rows
    return count_exact(demo_answers(adapter_dir, rows), rows), len(rows)
