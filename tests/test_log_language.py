"""Every line the engine writes to the run log (and the preview's notes) reads in the page's language (issue 24 item 8,
issue 20's log lines, issue 39's keys): each line of a real run's events.jsonl, and the lines the engine writes only
in rarer cases (from the engine's own functions), carry their locale key and values, are said by that key in pt and
fr with no English word left, and write numbers with the language's decimals and digit grouping."""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import subprocess
import sys
import threading

import pytest

from core.jobs.view import format_event
from core.messages import SaidLine, keyed, words_of
from core.runs.events import make_event, read_events
from ui.render import log_line

LANGS = ("pt", "fr")
# English words that no pt/fr line may keep (proper names, paths and quoted texts are taken out first)
ENGLISH = re.compile(r"\b(the|and|of|is|are|not|with|rows?|trains?|trained|trainable|whole|held|never|every|steps?|"
                     r"fits?|reference|after|before|saved|saving|only|cut|dropped|kept|ran|memory|lines|model|data|"
                     r"layers|parameters|finished|requested|validation rows|output|share|incomplete|damaged|"
                     r"Loading|Reading|Finding|Training|WARNING|ERROR|loss|completion)\b")
QUOTED = re.compile(r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"")
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def english_left(text: str) -> list[str]:
    """The English words of a rendered line, outside quoted texts (prompts, answers), paths and [splits]."""
    text = re.sub(r"\[[^\]]*\]", " ", QUOTED.sub(" ", text))
    text = " ".join(w for w in text.split() if "/" not in w)
    return ENGLISH.findall(text)


def check_lines(lines: list[str]) -> dict[str, list[str]]:
    """Each engine line carries its message's key (not a sentence the page would have to recognise); in pt and fr it
    is said by that key with no English word left; in English it stays as written."""
    out = {}
    for lang in LANGS:
        said = []
        for line in lines:
            assert isinstance(line, SaidLine) and (line.said.get("key") or line.said.get("problems")), line
            assert log_line(line, "en") == line
            rendered = log_line(line, lang)
            assert not english_left(rendered), (lang, line, rendered, english_left(rendered))
            said.append(rendered)
        out[lang] = said
    return out


def every_event_keyed(events: list[dict]) -> None:
    """Every line a real run writes (log, phase, done) carries its key: the page says it by key, never by its English."""
    bare = [e.get("message") for e in events if e.get("kind") in ("log", "phase", "done") and not e.get("key")]
    assert bare == [], f"events without a key: {bare[:3]}"


@pytest.fixture(scope="module")
def chat_run(tmp_path_factory, demo_model_path):
    """ONE tiny real run: multi-turn conversations (every assistant turn trains; some cut, some dropped at
    max_length) on the demo model with a chat template, 5% of 200 rows held out for validation, an eval before training and
    at step 2 with sample answers, a checkpoint, and Stop after step 2."""
    from transformers import AutoTokenizer, TrainerCallback

    from core.config.settings import demo_config
    from core.train.recipe import run_training

    root = tmp_path_factory.mktemp("chatrun")
    model = root / "chat-model"
    shutil.copytree(demo_model_path, model)
    tok = AutoTokenizer.from_pretrained(model)
    tok.chat_template = CHATML
    tok.save_pretrained(model)
    rows = []
    for i in range(200):
        long = " ".join(["word"] * (40 if i % 7 == 0 else 1))
        rows.append({"messages": [{"role": "user", "content": f"Count {i}"},
                                  {"role": "assistant", "content": f"It is {i}."},
                                  {"role": "user", "content": "And then?"},
                                  {"role": "assistant", "content": f"Then {i + 1} {long}"}]})
    data = root / "chat.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    stop = threading.Event()

    class StopSoon(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            if state.global_step >= 1:
                stop.set()

    cfg = demo_config(model=str(model), dataset=str(data), dataset_split="train", output_dir=str(root / "runs"),
                      run_name="chat", max_steps=4, max_length=64, per_device_train_batch_size=8,
                      logging_steps=1, save_strategy="steps", save_steps=2, eval_steps=2.0, eval_samples=2,
                      eval_max_new_tokens=4)
    result = run_training(cfg, stop=stop, callbacks=[StopSoon()])
    assert result.status == "stopped", result.message
    return cfg, read_events(f"{result.run_dir}/events.jsonl")


def test_every_line_of_a_multi_turn_run_with_validation_reads_in_pt_and_fr(chat_run):
    cfg, events = chat_run
    every_event_keyed(events)
    lines = [x for x in map(format_event, events) if x]
    text = "\n".join(lines)
    for said in ("Validation: 10 of 200 rows held out", "Validation rows: 10 rows", "assistant turns:",
                 "The longest row", "eval baseline", "eval step 2/4", "(reference ", "step 1/4  loss",
                 "Checkpoint saved", "Stop requested: ending after step 2", "LoRA on ", "finished: stopped"):
        assert said in text, (said, text)  # the run wrote each kind of line this test is about
    said = check_lines(lines)
    fr, pt = "\n".join(said["fr"]), "\n".join(said["pt"])
    assert "Validation : 10 lignes sur 200 mises de côté (5 %, graine" in fr
    assert "Linhas de validação: 10 linhas em" in pt and "tours de l'assistant : " in fr
    assert "Arrêt demandé : fin après le pas 2" in fr and "(referência \"" in pt
    assert "perda de validação" in pt and "perte de validation" in fr and "eval_loss" not in pt + fr  # one name
    loss = next(e for e in events if e["kind"] == "metrics")["loss"]
    assert f"perte {loss:.4f}".replace(".", ",") in fr  # the language's decimal comma
    assert "4-bit" not in fr  # the phases in the page's words


def test_the_preview_of_the_same_data_says_its_notes_in_pt_and_fr(chat_run):
    """The preview's notes are the run log's lines (the split, the longest row, the turns, the LoRA line)."""
    import html

    from ui.data import preview

    cfg, _ = chat_run
    for lang in LANGS:
        page = preview(cfg.to_dict(), lang)
        notes = [html.unescape(n) for n in re.findall(r'class="mt-small mt-warn-text">([^<]*)<', page)]
        assert len(notes) == 3, page  # the longest row, the turns, the LoRA line
        for note in notes:
            assert not english_left(note), (lang, note)
        assert ("mises de côté" if lang == "fr" else "reservadas") in page


def test_every_line_of_the_shared_demo_run_reads_in_pt_and_fr(finished_run):
    every_event_keyed(finished_run.events)
    lines = [x for x in map(format_event, finished_run.events) if x]
    assert any("Validation: off, every row trains" in x for x in lines)  # 100 rows: too few to hold any out
    check_lines(lines)


def test_the_lines_of_rarer_cases_read_in_pt_and_fr(tmp_path, demo_model_path, demo_tokenizer):
    """What the engine writes on a resume past damaged checkpoints, for a model outside the matrix, with a separate
    validation file or none, on out of memory, when nothing would train: from the engine's own functions."""
    import datasets

    from core.config.settings import TrainConfig, demo_config
    from core.data import validation
    from core.data.plan import plan_rows
    from core.model import families
    from core.runs.folders import COMPLETE_MARKER, checkpoint_problem
    from core.files import storage_message
    from core.jobs.supervise import KILL_REASONS, Child

    texts = []  # (level, the event's words: key, params, English message)
    ckpts = tmp_path / "checkpoints"
    for name, files in (("checkpoint-1", {}), ("checkpoint-2", {COMPLETE_MARKER: "1", "trainer_state.json": "{"}),
                        ("checkpoint-3", {COMPLETE_MARKER: "1"}),
                        ("checkpoint-4", {COMPLETE_MARKER: "1", "trainer_state.json": "{}", "optimizer.pt": "x",
                                          "adapter_model.safetensors": "\x08" + "\x00" * 7 + "{}xx"})):
        (ckpts / name).mkdir(parents=True)
        for f, body in files.items():
            (ckpts / name / f).write_text(body, encoding="latin-1")
        texts.append(("warning", keyed("log.not_resuming", why=checkpoint_problem(ckpts / name))))
    texts.append(("info", words_of(families.note(next(m for m in ("gpt2", "opt", "bloom") if m not in families.VERIFIED)))))
    raw = datasets.Dataset.from_dict({"text": [f"row {i}" for i in range(250)]})
    (tmp_path / "val.jsonl").write_text('{"text": "a b"}\n' * 3, encoding="utf-8")
    for cfg in (TrainConfig(), TrainConfig(validation_share=0.0), TrainConfig(validation_data=str(tmp_path / "val.jsonl"))):
        texts.append(("info", words_of(validation.split(cfg, raw, "text").why)))
    texts.append(("info", words_of(validation.split(TrainConfig(), raw.select(range(20)), "text").why)))
    demo = demo_config(per_device_train_batch_size=4, max_length=8, long_prompts="drop")
    refusal = plan_rows(demo, demo_tokenizer).refusal()
    assert refusal
    texts.append(("error", words_of(refusal)))
    from core.data.plan import DataError
    from core.messages import fields_of
    from core.train.data import plan_data

    with pytest.raises(DataError) as no_validation:  # keep_best on the demo's 100 rows: nothing is held out
        plan_data(demo_config(keep_best=True), lambda e: None)
    texts.append(("error", {"message": str(no_validation.value), **fields_of(no_validation.value)}))
    for code in (errno.ENOSPC, errno.EROFS, errno.EACCES):  # a write the user can fix (error_type disk)
        texts.append(("error", words_of(storage_message(OSError(code, os.strerror(code)), tmp_path / "runs"))))
    # a child that ended without its done event: each reason the supervisor ends one for, and an unexpected end
    log = tmp_path / "train.log"
    log.write_text("Traceback (most recent call last):\nRuntimeError: boom\n", encoding="utf-8")
    for argv in (["-c", "pass"], ["-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"]):
        child = Child.spawn([sys.executable, *argv], tmp_path / "STOP", ack_s=30, finish_s=600, log=subprocess.DEVNULL)
        child.proc.wait()
        texts.append(("error", words_of(child.death_message("log.died"))))  # the manager's
        texts.append(("error", words_of(child.death_message("log.worker_died", world_size=2))))  # the launcher's
    died = child.death_message("log.died", log)  # with the log's last lines, quoted as they are
    assert died.splitlines()[-1] == "RuntimeError: boom" and died.key == "msg.lines"
    from transformers import T5Config

    from core.model.load import ModelError, lora_targets

    T5Config(num_layers=1, d_model=16, d_ff=32, num_heads=2, vocab_size=64).save_pretrained(tmp_path / "t5")
    with pytest.raises(ModelError) as not_causal:  # an encoder-decoder model: refused by name, up front
        lora_targets(TrainConfig(model=str(tmp_path / "t5")))
    texts.append(("error", {"message": str(not_causal.value), **fields_of(not_causal.value)}))
    from core.gpus.distributed import plan as gpu_plan
    from core.messages import Said

    reasons = set()
    for changes, n_gpus, fits in (({}, 1, None), ({"num_gpus": "2", "distributed_strategy": "fsdp"}, 2, None),
                                  ({"num_gpus": "2"}, 2, False), ({"num_gpus": "2"}, 2, True),
                                  ({"num_gpus": "2", "device": "cpu"}, 0, None), ({"num_gpus": "2"}, 2, None)):
        p = gpu_plan(TrainConfig(**changes), n_gpus=n_gpus, fits_one_gpu=fits)
        reasons.add(p.reason)
        texts.append(("info", words_of(Said("log.processes", n=p.world_size, per=p.processes_per_machine,
                                            machines=p.num_machines, strategy=p.strategy, reason=p.reason))))
    assert len(reasons) == 6
    for reason in KILL_REASONS:
        child.kill_reason = reason
        texts.append(("error", words_of(child.death_message("log.died"))))
    lines = [format_event(make_event("error", error_type="data", **words)) if level == "error"
             else format_event(make_event("log", level=level, **words)) for level, words in texts]
    said = check_lines(lines)
    fr = "\n".join(said["fr"])
    assert "est endommagé (ce n'est pas du JSON valide)" in fr and "n'est pas dans la matrice" in fr
    assert "nécessitent des lignes de validation, et il n'y en a aucune. Validation : désactivée" in fr
    assert "Rien ne s'entraînerait" in fr
    assert "lignes sur 250 mises de côté (5 %, graine 42), jamais entraînées" in fr
    assert "Validation : 3 lignes de " in fr
    assert "Plus d'espace libre dans" in fr and "tué par le signal SIGKILL" in fr and "(code de sortie 0)" in fr
    assert "n'est pas un modèle de langue causal" in fr and "Terminé aussitôt par Terminer maintenant" in fr
    assert "restent disponibles pour Reprendre" in fr
    assert len(said["pt"]) == len(texts) == 30


def test_counts_are_grouped_and_decimals_written_as_the_language_writes_them():
    from core.messages import Said

    outcomes = Said("msg.list", items=[Said("preview.reason.kept", n=12000), Said("preview.reason.truncated", n=1),
                                       Said("preview.reason.dropped_empty", n=344)])
    data = format_event(make_event("log", level="info", **keyed("log.data", rows=12345, dataset="d (dolly)", train=12001,
                                                                max_length="2048", outcomes=outcomes, packs="")))
    assert data.endswith("Data: 12345 rows in d (dolly), 12001 train at max_length 2048: 12000 kept whole, "
                         "1 answer cut at max_length, 344 dropped: empty or null")  # the engine's English, as ever
    assert log_line(data, "pt").endswith("Dados: 12.345 linhas em d (dolly), 12.001 treinam com max_length 2048: "
                                         "12.000 mantidas inteiras, 1 com a resposta cortada em max_length, "
                                         "344 descartadas: vazias ou nulas")
    assert "Données : 12\u202f345 lignes dans d (dolly), 12\u202f001 s'entraînent" in log_line(data, "fr")
    step = format_event(make_event("log", level="info", **keyed("log.step", step=1200, total=2000, loss=1.23449,
                                                                lr=0.0002, grad_norm=0.5)))
    assert step.endswith("  step 1200/2000  loss 1.2345  lr 2.00e-04  grad_norm 0.500")
    assert log_line(step, "pt").endswith("  passo 1.200/2.000  perda 1,2345  lr 2,00e-04  grad_norm 0,500")


def test_the_preview_says_gpt2_c_proj_is_a_shared_name_not_a_fused_layer(tmp_path):
    """GPT-2's c_attn is one fused q,k,v layer; its c_proj is the attention's output projection, and the MLP's output
    projection has the same name (so LoRA lands on both): the preview says so, as the run log does."""
    from transformers import GPT2Config

    from core.config.settings import TrainConfig
    from core.jobs.preview import lora_line
    from ui.data import text_of

    def _lora_line(cfg, lang):  # worked out as the preview child does, said as the page does
        return text_of(lora_line(cfg), lang)

    GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=128, n_positions=64).save_pretrained(tmp_path)
    cfg = TrainConfig(model=str(tmp_path))  # the chapter's q, k, v, o
    en = _lora_line(cfg, "en")
    # LoRA by role (issue 41): o is the attention block's c_proj only, never the MLP's of the same name
    assert en.startswith("LoRA on c_attn, attn.c_proj: 4 layers, ")  # 2 x c_attn, 2 x attn.c_proj
    assert "c_attn trains whole: one fused layer holds q, k and v" in en
    assert "o_proj -> attn.c_proj" in en
    assert "c_proj trains whole" not in en and "holds the attention" not in en
    fr = _lora_line(cfg, "fr")
    assert "c_attn s'entraîne en entier : une couche fusionnée contient q, k et v" in fr
    assert not english_left(fr), fr
    pt = _lora_line(cfg, "pt")
    assert "uma camada fundida contém q, k e v" in pt and not english_left(pt), pt
    # a name GPT-2 lacks: refused with its real linear layers, in the preview and the run log, in the page's language
    wrong = cfg.replace(lora_target_modules=["gate_proj"])
    assert _lora_line(wrong, "en").startswith("lora_target_modules: gate_proj match no linear layer of ")
    assert _lora_line(wrong, "fr").startswith("lora_target_modules : gate_proj ne correspondent à aucune couche linéaire")
    from core.config.settings import ConfigError
    from core.model.load import lora_targets

    with pytest.raises(ConfigError) as refused:
        lora_targets(wrong)
    from core.messages import fields_of

    check_lines([format_event(make_event("error", error_type="config", message=str(refused.value),
                                         **fields_of(refused.value)))])


def test_historys_failed_run_says_its_message_in_the_pages_language(tmp_path):
    """History's run detail words a failed run's message like the run log does (it used to stay English)."""
    from core.config.settings import demo_config
    from core.runs.folders import create_run_dir, record_failure
    from html import escape as html_escape

    from core.messages import Said
    from core.runs.history import load_run
    from ui.render import run_detail_html, said

    cfg = demo_config(output_dir=str(tmp_path / "runs"))
    run = create_run_dir(cfg, cfg.to_yaml())
    message = Said("log.died", how=Said("log.exit_code", code=3))  # the supervisor's, by its key
    assert message == "The training process died unexpectedly (exit code 3)."
    record_failure(run, message, "crash", exit_code=3)
    detail = load_run(run)
    assert message in run_detail_html(detail, "en")
    for lang in ("pt", "fr"):
        html = run_detail_html(detail, lang)
        assert message not in html and html_escape(said(message.key, message.params, lang)) in html


def test_the_adapter_pickers_label_words_the_loss_in_the_pages_language(finished_run):
    """Try it / Export's adapter list: "loss 0.026" in English, the language's word and decimal comma in pt and fr."""
    from ui.tryexport import adapter_dropdown

    final = finished_run.result.summary["final_loss"]
    labels = {lang: adapter_dropdown(str(finished_run.out), lang=lang)["choices"][0][0] for lang in LANGS + ("en",)}
    assert labels["en"].endswith(f"loss {final:.3f})")
    for lang, word in (("pt", "perda"), ("fr", "perte")):
        assert labels[lang].endswith(f"{word} {final:.3f})".replace(".", ","))
        assert not english_left(labels[lang].rpartition("(")[2])  # the run's own name aside
