"""What a run says while it trains, and how it hears Stop: the phases, the Trainer callbacks, the stop watch.

core/train/recipe.py uses these; none of them decides anything about training. Every one reports through an event
sink (core/runs/events.py): `phase` keeps a long step (a download, a load) audibly alive, `EventCallback` turns the
Trainer's steps, logs and evals into `step`/`metrics`/`eval` events and ends the run after the current step when Stop
is asked, `watch_stop` answers a Stop at once, `WarmUp` pays the GPU's one-time set-up before step 1 as a phase of
its own (leaving training exactly as it was), and `BarOnly` keeps the Trainer's terminal progress bar without its log
dicts. Their words are keyed (core.messages.keyed): a page says them in its own language.
"""

from __future__ import annotations

import contextlib
import copy
import random
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Protocol

import numpy as np
import torch
from transformers import TrainerCallback
from transformers.trainer_callback import ProgressCallback

from core.config.slices import ModelSlice, StageSlice
from core.data.validation import generate_answers
from core.gpus import distributed, vram
from core.messages import keyed
from core.runs.events import EventSink, make_event, one_line, prompt_gist
from core.runs.folders import COMPLETE_MARKER
from core.train.rewards import BY_SCORER, grpo_metrics, reward_metrics, rewards_said

HEARTBEAT_S = 2.0  # no phase stays silent longer than this


def rewards_line(rewards: dict[str, float], logs: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A preference step's (prefix "eval_": an eval's) reward line. KTO has no pairs, so no accuracy: its line says
    what KTO measures, the desirable and undesirable answers' rewards and the KL term (TRL's `kl`), a value this
    batch lacked as a dash, never nan."""
    kind = "eval_" if prefix else ""
    if "reward_mean" in rewards:  # GRPO
        by = ", ".join(f"{k[len(BY_SCORER):]} {v:.3f}" for k, v in rewards.items() if k.startswith(BY_SCORER))
        kl = rewards.get("kl")
        return keyed("log.grpo.rewards", reward=rewards["reward_mean"], scorers=by or "-",
                     length=rewards.get("completion_length", 0.0), kl="-" if kl is None else f"{kl:.4f}")
    if "reward_accuracy" in rewards:
        return keyed(f"log.pref.{kind}rewards", **rewards_said(rewards))
    kl = logs.get(prefix + "kl")
    values = {**rewards, "kl": kl if isinstance(kl, (int, float)) and np.isfinite(kl) else None}
    shown = {name: "-" if values.get(field) is None else f"{values[field]:.{digits}f}" for name, field, digits in
             (("chosen", "reward_chosen", 3), ("rejected", "reward_rejected", 3), ("kl", "kl", 3),
              ("logp_chosen", "logp_chosen", 2), ("logp_rejected", "logp_rejected", 2))}
    return keyed(f"log.pref.kto_{kind}rewards", **shown)


@contextlib.contextmanager
def phase(sink: EventSink, name: str, key: str, **params: Any) -> Iterator[Callable[[float], None]]:
    """Announce a phase (its words: locale `key` with `params`) and keep saying it is alive every few seconds until
    it ends. The phase is handed a function to say how far it is (0 to 1): the next beats carry it ("(12 s, 34%)")."""
    said = keyed(key, **params)
    sink(make_event("phase", phase=name, progress=None, **said))
    done = threading.Event()
    start = time.monotonic()
    share: list[float | None] = [None]

    def beat() -> None:
        while not done.wait(HEARTBEAT_S):
            elapsed = round(time.monotonic() - start)  # a page saying the key adds it as the English does
            part = share[0]
            tail = f"{elapsed} s" if part is None else f"{elapsed} s, {round(100 * part)}%"
            sink(make_event("phase", phase=name, progress=part, elapsed_s=elapsed,
                            **{**said, "message": f"{said['message']} ({tail})"}))

    thread = threading.Thread(target=beat, daemon=True, name=f"memtune-heartbeat-{name}")
    thread.start()
    try:
        yield lambda fraction: share.__setitem__(0, min(1.0, max(0.0, fraction)))
    finally:
        done.set()
        thread.join()


def watch_stop(emit: EventSink, stop: threading.Event, stop_file: Path) -> threading.Event:
    """Until the returned event is set: turn a stop file into the stop flag, and say at once that Stop was seen.

    The stop file (written by the app's job manager, or `touch RUN/STOP` by hand) and a signal (SIGTERM sets the
    flag in `main`) are the two ways to ask; the `ack` event tells the manager the run is alive and ending, so it
    waits for the current step instead of killing the run.
    """
    done = threading.Event()

    def watch() -> None:
        while not done.wait(0.5):
            if stop.is_set() or stop_file.exists():
                stop.set()
                emit(make_event("log", level="info", ack="stop", **keyed("log.stop_ack")))
                return

    threading.Thread(target=watch, daemon=True, name="memtune-stop-watch").start()
    return done


class _WarmedUp(ModelSlice, StageSlice, Protocol):
    """kernel_warmup and the stage whose training step it would run."""


def warms_up(cfg: _WarmedUp, cuda: bool) -> bool:
    """kernel_warmup: auto is on with CUDA (the first step pays seconds of one-time set-up there), off on the CPU,
    which has no such set-up: there the pass would only cost one more micro-step. Never for GRPO: its training_step
    samples answers and counts micro-steps to know when to sample again, so a pass of it is a step of training."""
    if cfg.stage == "grpo":
        return False
    return cfg.kernel_warmup == "on" or (cfg.kernel_warmup == "auto" and cuda)


class WarmUp(TrainerCallback):
    """Pays the GPU's one-time set-up before step 1 (TrainConfig.kernel_warmup): one forward + backward through the
    Trainer's own `training_step` on a real first micro-batch, then the gradients zeroed.

    Why on_train_begin and not a pass before trainer.train(): only here is the model what the Trainer trains
    (accelerate's prepare done: DDP/FSDP wrapping, autocast, gradient checkpointing on, a resumed checkpoint
    loaded), so the kernels, shapes and collectives are the training step's own. Every process of a run does it
    (the config is the same on each), so DDP's all-reduce and FSDP's gathers match across ranks. Nothing of training
    moves: no optimizer or scheduler step, torch's RNG forked (CPU and this GPU) and Python's and numpy's put back,
    the sampler's generators put back (the data order is drawn from them), TRL's per-step metrics (token accuracy,
    entropy, token count) put back so the first logged step is the same as without it.

    `trainer` is set once the Trainer is built (it takes its callbacks when it is made, and the warm-up runs its
    own training_step); it must come before the EventCallback, so that training's clock starts after it.
    """

    def __init__(self, sink: EventSink, compiler=None) -> None:
        self.sink = sink
        self.trainer = None
        self.seconds: float | None = None
        # compile_layers' callback (core/model/compile.py): the layers compile in this pass, so its phase is
        # "compiling", in the compile cache's words (loaded or first time for this shape)
        self.compiler = compiler

    def on_train_begin(self, args, state, control, train_dataloader=None, **kw):
        if self.trainer is None or train_dataloader is None:
            return
        began = time.monotonic()
        tokens = warm_up(self.trainer, train_dataloader, self.sink, self.compiler)
        if tokens is None:
            return
        if self.compiler is not None:
            self.compiler.compiled()
        self.seconds = round(time.monotonic() - began, 3)
        # the phase's last event: its duration (bench/product.py reads `seconds`)
        self.sink(make_event("phase", phase="warming_up", progress=None, seconds=self.seconds, tokens=tokens,
                             **keyed("log.phase.warmed_up", seconds=self.seconds)))


class EventCallback(TrainerCallback):
    """Emits step, metrics and eval events, honours Stop (flag or stop file) and marks checkpoints complete.

    With validation rows (`samples`: core.data.validation.samples), each eval also says what the model answers now
    to those prompts (`tokenizer`, at most `max_new_tokens`); `warmup` is the run's WarmUp, whose time the summary
    reports."""

    def __init__(self, sink: EventSink, stop: threading.Event, stop_file: Path | None, cuda: bool,
                 samples: list[dict] = (), tokenizer: Any = None, max_new_tokens: int = 32,
                 warmup: WarmUp | None = None) -> None:
        self.sink = sink
        self.stop = stop
        self.stop_file = stop_file
        self.cuda = cuda
        self.samples = list(samples)
        self.tokenizer = tokenizer
        self.max_new_tokens = max_new_tokens
        self.warmup = warmup
        self.start = time.monotonic()
        self.first_loss: float | None = None
        self.last_loss: float | None = None
        self.tokens_at_start = 0
        self.steps_at_start = 0
        self.stopped = False
        self.rng: dict | None = None
        self.evals: list[dict] = []  # {step, eval_loss} in order, this process's evals
        self.last_eval_step: int | None = None
        self.last_answers: list[dict] = []

    def on_train_begin(self, args, state, control, **kw):
        self.rng = rng_state()  # the eval before training (eval_on_start) comes next
        self.start = time.monotonic()
        self.tokens_at_start = state.num_input_tokens_seen or 0
        self.steps_at_start = state.global_step
        self.sink(make_event("phase", phase="training", progress=0.0, **keyed("log.phase.training", n=state.max_steps)))

    def on_log(self, args, state, control, logs=None, **kw):
        logs = logs or {}
        if "loss" not in logs:
            return
        loss = float(logs["loss"])
        self.first_loss = loss if self.first_loss is None else self.first_loss
        self.last_loss = loss
        lr, grad_norm = logs.get("learning_rate"), logs.get("grad_norm")
        # preference stages: TRL's reward accuracy, margins, log-probabilities; GRPO: its rewards, lengths, KL
        rewards = grpo_metrics(logs) or reward_metrics(logs)
        if "completion_length" in rewards and getattr(args, "max_completion_length", None):
            rewards["completion_share"] = round(rewards["completion_length"] / args.max_completion_length, 6)
        self.sink(make_event("metrics", step=state.global_step, total_steps=state.max_steps,
                             epoch=round(state.epoch or 0.0, 4), loss=loss, learning_rate=lr,
                             grad_norm=float(grad_norm) if grad_norm is not None else None, **rewards))
        said = keyed("log.step", step=state.global_step, total=state.max_steps, loss=loss, lr=float(lr or 0),
                     grad_norm=float(grad_norm or 0))
        self.sink(make_event("log", level="info", **said))
        if rewards:  # one line of its own (log.pref.rewards), so SFT's step line stays as it was
            self.sink(make_event("log", level="info", **rewards_line(rewards, logs)))

    def on_step_end(self, args, state, control, **kw):
        elapsed = time.monotonic() - self.start
        done = state.global_step - self.steps_at_start
        remaining = max(0, state.max_steps - state.global_step)
        tokens = (state.num_input_tokens_seen or 0) - self.tokens_at_start
        mem = vram.torch_peaks() if self.cuda else None
        self.sink(make_event(
            "step", step=state.global_step, total_steps=state.max_steps, epoch=round(state.epoch or 0.0, 4),
            tokens=int(state.num_input_tokens_seen or 0),
            tokens_per_s=round(tokens / elapsed, 1) if elapsed > 0 else None,
            elapsed_s=round(elapsed, 2),
            eta_s=round(elapsed / done * remaining, 1) if done else None,
            gpu_mem_gib=mem["allocated_gib"] if mem else None,
            peak_gib=mem["peak_allocated_gib"] if mem else None,
        ))
        wanted = self.stop.is_set() or (self.stop_file is not None and self.stop_file.exists())
        if distributed.world_size() > 1:
            wanted = distributed.any_rank(wanted)  # every process ends after the same step
        if args.eval_strategy != "no":
            self.rng = rng_state()  # an eval may follow this step: training resumes from exactly this state
        if (args.eval_strategy != "no" and state.global_step >= state.max_steps and not wanted
                and self.last_eval_step != state.global_step):
            control.should_evaluate = True  # the end of the run, when it is not an eval step already
        if wanted:
            self.stop.set()
            self.stopped = True
            control.should_training_stop = True
            self.sink(make_event("log", level="info", ack="stop", **keyed("log.stop_after", step=state.global_step)))
        return control

    def on_evaluate(self, args, state, control, metrics=None, model=None, **kw):
        """The Trainer's eval has just run: its loss, and what the model answers now to a few validation prompts."""
        loss = (metrics or {}).get("eval_loss")
        if loss is None:
            return
        if self.rng is not None:
            # The eval drew from the random generators (the data order of the next epoch is drawn from torch's):
            # put them back, so a run with validation trains on exactly what the same run without it would.
            set_rng_state(self.rng)
        self.last_eval_step = state.global_step
        answers = []
        began = time.monotonic()
        if self.samples and model is not None and distributed.world_size() == 1:
            got = generate_answers(model, self.tokenizer, [s["prompt_ids"] for s in self.samples], self.max_new_tokens)
            answers = [{"prompt": s["prompt"], "reference": s["reference"], "answer": a}
                       for s, a in zip(self.samples, got)]
        self.evals.append({"step": state.global_step, "eval_loss": float(loss)})
        # a preference stage's eval: TRL's reward accuracy, margins, log-probabilities on the validation pairs
        rewards = reward_metrics(metrics or {}, prefix="eval_")
        self.sink(make_event("eval", step=state.global_step, total_steps=state.max_steps, eval_loss=float(loss),
                             best_eval_loss=state.best_metric, answers=answers,
                             loss_s=(metrics or {}).get("eval_runtime"), answers_s=round(time.monotonic() - began, 3),
                             **rewards))
        # "validation loss": the page's and README's name for it (events and summary.json keep the key eval_loss)
        said = (keyed("log.eval_baseline", loss=float(loss)) if state.global_step == 0 else
                keyed("log.eval", step=state.global_step, total=state.max_steps, loss=float(loss)))
        self.sink(make_event("log", level="info", **said))
        if rewards:  # its own line (log.pref.eval_rewards), as the training steps' log.pref.rewards
            self.sink(make_event("log", level="info", **rewards_line(rewards, metrics or {}, "eval_")))
        for a in answers:  # the question asked, whole words, as written: no repr escapes or a cut template
            asked, answer, ref = prompt_gist(a["prompt"]), one_line(a["answer"]), one_line(a["reference"])
            self.sink(make_event("log", level="info", **keyed("log.answer", prompt=asked, answer=answer,
                                                              reference=ref)))
        self.last_answers = answers

    def eval_summary(self, args, state) -> dict | None:
        """summary.json["eval"]: every eval loss of the run (a resumed run's earlier ones from the Trainer's
        log history), the baseline, the last, the best and its step, whether it stopped early."""
        history = [(int(h["step"]), float(h["eval_loss"])) for h in state.log_history if "eval_loss" in h]
        if not history:
            return None
        losses = sorted(dict(history).items())
        best_step, best = min(losses, key=lambda sl: (sl[1], sl[0]))
        ckpt = state.best_model_checkpoint
        return {"losses": losses, "baseline": losses[0][1] if losses[0][0] == 0 else None,
                "final": losses[-1][1], "final_step": losses[-1][0], "best": best, "best_step": best_step,
                "best_checkpoint": ckpt,
                # the step the saved adapter's weights are from: the best checkpoint's with keep_best
                "adapter_step": (int(ckpt.rsplit("-", 1)[1]) if ckpt and args.load_best_model_at_end
                                 else state.global_step),
                "stopped_early": bool(state.global_step < state.max_steps and not self.stopped),
                "answers": self.last_answers}

    def on_save(self, args, state, control, **kw):
        # Called after the Trainer has fully written the checkpoint: only now is it safe to resume from.
        ckpt = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        if ckpt.is_dir() and distributed.is_main():
            (ckpt / COMPLETE_MARKER).write_text(str(time.time()), encoding="utf-8")
            self.sink(make_event("log", level="info", **keyed("log.checkpoint", path=ckpt)))


class BarOnly(ProgressCallback):
    """The Trainer's progress bar on a terminal, without its copy of every log dict."""

    def on_log(self, args, state, control, logs=None, **kwargs):
        return None


def warm_up(trainer, train_dataloader, sink: EventSink, compiler=None) -> int | None:
    """One forward + backward of the Trainer's first micro-batch, leaving training exactly as it was (WarmUp's
    docstring says what is kept). Returns the micro-batch's token count, or None when there is no batch.
    `compiler`: compile_layers' callback, whose words the phase says (phase "compiling")."""
    # The plain DataLoader under accelerate's DataLoaderShard: the same sampler shard and collator, without the
    # shard's own iteration bookkeeping (its epoch counter, its rank-0 broadcast of the generator's state).
    loader = getattr(train_dataloader, "base_dataloader", train_dataloader)
    generators = _sampler_generators(loader)
    saved = [(g, g.get_state()) for g in generators]
    py_state, np_state = random.getstate(), np.random.get_state()
    metrics = copy.deepcopy(getattr(trainer, "_metrics", None))
    total_tokens = getattr(trainer, "_total_train_tokens", None)
    had_ga = "current_gradient_accumulation_steps" in vars(trainer)
    devices = [torch.cuda.current_device()] if torch.cuda.is_available() and torch.cuda.is_initialized() else []
    try:
        # fork_rng over the GPU training uses only: forking every device would start a CUDA context on the others
        with torch.random.fork_rng(devices=devices):
            batches, n_items = trainer.get_batch_samples(iter(loader), 1, trainer.args.device)
            if not batches:
                return None
            batch = batches[0]
            # the micro-batch's sequences: SFT's, DPO's and KTO's in input_ids, ORPO's in chosen_/rejected_input_ids
            tokens = sum(int(batch[k].numel()) for k in ("input_ids", "chosen_input_ids", "rejected_input_ids")
                         if batch.get(k) is not None)
            said = compiler.words() if compiler is not None else keyed("log.phase.warming_up", tokens=tokens)
            with phase(sink, "compiling" if compiler is not None else "warming_up", said["key"], **said["params"]):
                if not had_ga:  # set by the training loop per optimizer step; the loss scale is irrelevant here
                    trainer.current_gradient_accumulation_steps = 1
                trainer.training_step(trainer.model_wrapped, batch, n_items)
                if devices:
                    torch.cuda.synchronize()  # the work is done when the phase ends, not queued into step 1
        return tokens
    finally:
        trainer.model_wrapped.zero_grad(set_to_none=True)  # as the Trainer left them just before on_train_begin
        for g, st in saved:
            g.set_state(st)
        random.setstate(py_state)
        np.random.set_state(np_state)
        if metrics is not None:
            trainer._metrics = metrics
        if total_tokens is not None:
            trainer._total_train_tokens = total_tokens
        if not had_ga:
            vars(trainer).pop("current_gradient_accumulation_steps", None)


def _sampler_generators(loader) -> list:
    """The torch.Generators a DataLoader's order is drawn from (its own, its sampler's, a sharded batch sampler's)."""
    found, seen = [], set()
    for obj in (loader, getattr(loader, "sampler", None), getattr(loader, "batch_sampler", None)):
        for o in (obj, getattr(obj, "sampler", None), getattr(obj, "batch_sampler", None),
                  getattr(getattr(obj, "batch_sampler", None), "sampler", None)):
            g = getattr(o, "generator", None)
            if isinstance(g, torch.Generator) and id(g) not in seen:
                seen.add(id(g))
                found.append(g)
    return found


def rng_state() -> dict:
    """Every random generator a Trainer step may draw from (Python, numpy, torch CPU and CUDA)."""
    return {"python": random.getstate(), "numpy": np.random.get_state(), "cpu": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None}


def set_rng_state(st: dict) -> None:
    random.setstate(st["python"])
    np.random.set_state(st["numpy"])
    torch.set_rng_state(st["cpu"])
    if st["cuda"] is not None:
        torch.cuda.set_rng_state_all(st["cuda"])
