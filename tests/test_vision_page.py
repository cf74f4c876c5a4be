"""The page's side of image rows: the data preview (thumbnails made in the preview's child from the checked images,
the exact text that trains, the image tokens per row as the processor counts them), the public step check counting
image rows as the vision run plans them, and Try it with an image (the box shown for an image-text adapter only; the
answer the one the run's held-out scorer gives, in-process and from the Try it child)."""

import json
import shutil
from pathlib import Path

import pytest

from core.config.settings import DEMO_VISION_DATA, demo_vision_config
from core.data.read import PREVIEW_LIMIT
from core.jobs.preview import answer

DEMO_IMAGE = DEMO_VISION_DATA.parent / "images" / "circle-red-0.png"


def image_rows(folder: Path, n: int, image: str = "images/a.png") -> Path:
    """`n` rows asking about one image in `folder` (copied from the vision demo), as train.jsonl there."""
    (folder / "images").mkdir(parents=True, exist_ok=True)
    shutil.copyfile(DEMO_IMAGE, folder / "images" / "a.png")
    rows = [{"messages": [{"role": "user", "content": [{"type": "image", "image": image},
                                                       {"type": "text", "text": "What shape is this?"}]},
                          {"role": "assistant", "content": [{"type": "text", "text": "circle"}]}]}] * n
    data = folder / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return data


def test_the_preview_of_image_rows_shows_thumbnails_the_text_that_trains_and_the_image_tokens():
    from ui.data import preview_from

    cfg = demo_vision_config()
    found = answer(cfg.to_dict(), PREVIEW_LIMIT)
    assert found["stage"] == "images", found
    assert found["plan"]["n_train"] == found["plan"]["n_source"] == 120
    assert set(found["plan"]["image_tokens"]) == {16}  # the processor's count: 64 x 64 pixels, 16 tokens
    assert found["heldout"]["n"] == 24
    row = found["rows"][0]
    assert row["thumbs"] and all(t.startswith("data:image/png;base64,") for t in row["thumbs"])
    assert {"image_tokens": 16} in row["text"]
    text = "".join(part.get("text", "") for part in row["text"])
    first = json.loads(DEMO_VISION_DATA.read_text().splitlines()[0])["messages"]
    assert first[0]["content"][1]["text"] in text and first[1]["content"][0]["text"] in text
    assert row["tokens"] == found["plan"]["lengths"][0]

    html = preview_from(found, cfg, "en")
    assert html.count('class="mt-thumb" src="data:image/png;base64,') == len(found["rows"])
    assert "[16 image tokens]" in html and "16 of them image tokens" in html
    assert "Validation: 24 rows of" in html  # the held-out images, never trained on
    assert "<|begin_of_text|>" not in html and "&lt;|begin_of_text|&gt;" in html  # the text escaped
    assert "What shape is this?" in html or "What colour is the shape?" in html


def test_in_public_mode_an_image_outside_the_visitors_dataset_folder_is_refused_and_never_shown(public_mode,
                                                                                               tmp_path):
    from core.runs.public import upload_root

    secret = tmp_path / "elsewhere" / "secret.png"  # another visitor's, or the server's own
    secret.parent.mkdir()
    shutil.copyfile(DEMO_IMAGE, secret)
    data = image_rows(upload_root() / "mine", 3, image=str(secret))
    try:
        found = answer(demo_vision_config(dataset=str(data), validation_data="").to_dict(), PREVIEW_LIMIT)
    finally:
        shutil.rmtree(data.parent)
    assert found["error"] == "data", found
    assert [line["key"] for line in found["words"]["params"]["lines"]] == ["data.img.outside"] * 3
    assert "data:image" not in json.dumps(found)


def test_a_preview_of_image_rows_with_a_text_model_says_so():
    found = answer(demo_vision_config(model="memtune/demo-tiny-llama").to_dict(), PREVIEW_LIMIT)
    assert found["error"] == "data" and found["words"]["key"] == "data.err.images_text_model", found


def test_the_public_step_check_counts_image_rows_as_the_vision_run_plans_them(tmp_path):
    from core.checks import rows_to_train

    data = image_rows(tmp_path, 200)  # a text run holds out 5% of 200 rows; a vision run trains every row
    cfg = demo_vision_config(dataset=str(data), validation_data="")
    assert rows_to_train(cfg) == 200
    assert rows_to_train(cfg.replace(packing=True)) == 200  # image rows never pack: their rows are what trains


def test_the_try_it_image_box_shows_for_an_adapter_trained_on_images_only(tmp_path):
    from ui.tryexport import on_try_adapter

    (tmp_path / "text").mkdir()
    (tmp_path / "text" / "tokenizer_config.json").write_text("{}")
    (tmp_path / "vision").mkdir()
    (tmp_path / "vision" / "processor_config.json").write_text("{}")
    assert on_try_adapter(str(tmp_path / "vision"))["visible"] is True
    assert on_try_adapter(str(tmp_path / "text"))["visible"] is False
    assert on_try_adapter(None)["visible"] is False


@pytest.fixture(scope="module")
def vision_adapter(tmp_path_factory):
    from core.train.recipe import run_training

    result = run_training(demo_vision_config(max_steps=4, output_dir=str(tmp_path_factory.mktemp("runs")),
                                             heldout_rows=2))
    assert result.status == "completed", result.message
    return Path(result.adapter_dir)


def test_try_it_with_an_image_answers_as_the_runs_heldout_scorer_in_process_and_from_its_child(vision_adapter):
    from core.data.images import ImageRow
    from core.infer import Comparer
    from core.jobs.manager import JobManager
    from core.train import vision as vision_train
    from tests.test_actions import SETTINGS, answer as answered

    row = json.loads(DEMO_VISION_DATA.with_name("heldout.jsonl").read_text().splitlines()[0])
    image = str(DEMO_VISION_DATA.parent / row["messages"][0]["content"][0]["image"])
    asked = row["messages"][0]["content"][1]["text"]
    comparer = Comparer()
    base, tuned = comparer.answer(vision_adapter, asked, image=image, **SETTINGS)
    loaded = comparer.load(vision_adapter)
    scored = vision_train.answer(loaded.model, loaded.processor, [ImageRow(
        [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": asked}]},
         {"role": "assistant", "content": [{"type": "text", "text": "-"}]}], [image])],
        max_new_tokens=SETTINGS["max_new_tokens"])
    assert tuned.strip() == scored[0] and tuned.strip()
    with loaded.model.disable_adapter():
        assert base.strip() == vision_train.answer(loaded.model, loaded.processor, [ImageRow(
            [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": asked}]},
             {"role": "assistant", "content": [{"type": "text", "text": "-"}]}], [image])],
            max_new_tokens=SETTINGS["max_new_tokens"])[0]
    comparer.unload()

    manager = JobManager()
    try:
        child = manager.actions.try_child(str(vision_adapter))
        got = answered(child, child.ask(prompt=asked, image=image, **SETTINGS))
        assert got["status"] == "completed" and got["tuned"] == tuned and got["base"] == base, got
        assert not list((child.folder / "requests").glob("*-image*"))  # its copy of the image, gone once read
        bad = child.folder / "not-an-image.png"
        bad.write_text("text")
        got = answered(child, child.ask(prompt=asked, image=str(bad), **SETTINGS))
        error = next(e for e in child.events_since(0) if e.get("kind") == "error")
        assert got["status"] == "failed" and error["key"] == "infer.err.image", error
        assert error["params"]["why"]["key"] == "data.img.unreadable"
    finally:
        manager.shutdown()


def test_on_a_public_server_the_vision_demos_shipped_files_may_be_used_and_no_other_server_path(public_mode):
    from core.runs.public import public_problems

    fields = {p.field for p in public_problems(demo_vision_config())}
    assert not fields & {"dataset", "validation_data"}, fields
    elsewhere = str(DEMO_VISION_DATA.parent / "images" / "circle-red-0.png")
    assert "dataset" in {p.field for p in public_problems(demo_vision_config(dataset=elsewhere))}


def test_image_rows_all_longer_than_max_length_are_refused_in_the_preview_with_the_reason():
    from ui.data import preview_from

    cfg = demo_vision_config(max_length=20)  # each row is 34-35 tokens, 16 of them the image's: none fits
    found = answer(cfg.to_dict(), PREVIEW_LIMIT)
    assert found["plan"]["n_train"] == 0 and found["plan"]["refusal"]["key"] == "log.images_refusal"
    assert {r["reason"] for r in found["rows"]} == {"dropped_long"}
    html = preview_from(found, cfg, "en")
    assert "Nothing would train" in html and 'data-reason="dropped_long"' in html
