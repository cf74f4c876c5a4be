"""Image rows: recognised in both of TRL's shapes, every image checked before any model loads, every problem named
with its row at once, EXIF rotation applied."""

import json

import pytest
from PIL import Image

from core.config.settings import DEMO_VISION_DATA, TrainConfig
from core.data import images
from core.data.plan import check_data
from core.data.read import DataError


def write_rows(folder, rows):
    path = folder / "data.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def asked(image, question="What is it?", answer="a square"):
    return {"messages": [{"role": "user", "content": [{"type": "image", "image": image},
                                                      {"type": "text", "text": question}]},
                         {"role": "assistant", "content": [{"type": "text", "text": answer}]}]}


def read(path):
    raw, _ = check_data(TrainConfig(dataset=str(path)))
    return raw


def test_image_parts_and_llava_columns_are_image_rows_and_plain_messages_are_not(tmp_path):
    Image.new("RGB", (8, 8)).save(tmp_path / "a.png")
    assert images.has_images(read(write_rows(tmp_path, [asked("a.png")])))
    llava = {"images": ["a.png"], "messages": [{"role": "user", "content": "What is it?"},
                                               {"role": "assistant", "content": "black"}]}
    assert images.has_images(read(write_rows(tmp_path, [llava])))
    text = {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]}
    assert not images.has_images(read(write_rows(tmp_path, [text])))


def test_a_llava_row_gets_its_images_before_the_first_user_turn_in_order(tmp_path):
    for name in ("a.png", "b.png"):
        Image.new("RGB", (8, 8)).save(tmp_path / name)
    row = {"images": ["a.png", "b.png"], "messages": [{"role": "system", "content": "Be brief."},
                                                      {"role": "user", "content": "Same?"},
                                                      {"role": "assistant", "content": "no"}]}
    checked = images.check_images(read(write_rows(tmp_path, [row])), tmp_path)
    assert checked.problems == []
    user = checked.rows[0].messages[1]["content"]
    assert [p["type"] for p in user] == ["image", "image", "text"]
    assert checked.rows[0].images == [str((tmp_path / "a.png").resolve()), str((tmp_path / "b.png").resolve())]


def test_every_image_problem_is_named_with_its_row_in_one_refusal(tmp_path, monkeypatch):
    Image.new("RGB", (8, 8), (255, 0, 0)).save(tmp_path / "ok.png")
    (tmp_path / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n not an image")
    Image.new("RGB", (40, 40)).save(tmp_path / "big.png")
    frames = [Image.new("RGB", (8, 8), c) for c in ((255, 0, 0), (0, 255, 0))]
    frames[0].save(tmp_path / "moving.gif", save_all=True, append_images=frames[1:], duration=100)
    Image.new("CMYK", (8, 8)).save(tmp_path / "print.jpg")
    monkeypatch.setattr(images, "MAX_PIXELS", 1000)  # 40 x 40 = 1,600 pixels: too large
    rows = [asked("ok.png"), asked("missing.png"), asked("broken.png"), asked("big.png"), asked("moving.gif"),
            asked("print.jpg"), asked("https://example.com/cat.png"), asked(None),
            {"images": ["ok.png", "ok.png"], "messages": asked("ok.png")["messages"]}]
    path = write_rows(tmp_path, rows)
    checked = images.check_images(read(path), images.images_folder(str(path)))
    said = [(p.key, p.params["n"]) for p in checked.problems]
    assert said == [("data.img.missing", 2), ("data.img.unreadable", 3), ("data.img.too_large", 4),
                    ("data.img.animated", 5), ("data.img.cmyk", 6), ("data.img.url", 7), ("data.img.no_image", 8),
                    ("data.img.count", 9)]
    with pytest.raises(DataError) as refused:
        images.refuse(checked, str(path))
    assert refused.value.key == "data.err.images" and refused.value.params["n"] == 8
    assert [line["key"] for line in refused.value.params["lines"]] == [key for key, _ in said]
    assert "Row 6: image print.jpg is in CMYK" in str(refused.value)


def test_a_long_list_of_problems_is_cut_and_counted(tmp_path, monkeypatch):
    monkeypatch.setattr(images, "MAX_SAID", 2)
    checked = images.check_images(read(write_rows(tmp_path, [asked(f"gone{i}.png") for i in range(5)])), tmp_path)
    with pytest.raises(DataError) as refused:
        images.refuse(checked, "data.jsonl")
    lines = refused.value.params["lines"]
    assert [line["key"] for line in lines] == ["data.img.missing", "data.img.missing", "data.img.more"]
    assert lines[-1]["params"]["n"] == 3


def test_an_exif_rotated_photo_trains_upright_and_is_counted(tmp_path):
    photo = Image.new("RGB", (40, 20), (0, 0, 255))
    exif = photo.getexif()
    exif[0x0112] = 6  # "rotate 90 CW to view": stored landscape, shown portrait
    photo.save(tmp_path / "photo.jpg", exif=exif)
    checked = images.check_images(read(write_rows(tmp_path, [asked("photo.jpg")])), tmp_path)
    assert checked.problems == [] and checked.rotated == 1
    assert images.load_image(checked.rows[0].images[0]).size == (20, 40)


def test_public_mode_reads_no_image_outside_the_datasets_folder(tmp_path):
    (tmp_path / "data").mkdir()
    Image.new("RGB", (8, 8)).save(tmp_path / "secret.png")
    path = write_rows(tmp_path / "data", [asked("../secret.png")])
    checked = images.check_images(read(path), images.images_folder(str(path)), public=True)
    assert [p.key for p in checked.problems] == ["data.img.outside"]
    assert images.check_images(read(path), images.images_folder(str(path))).problems == []


def test_the_shipped_vision_demo_is_image_rows_that_all_pass_the_check():
    raw = read(DEMO_VISION_DATA)
    assert images.has_images(raw)
    checked = images.check_images(raw, images.images_folder(str(DEMO_VISION_DATA)))
    assert checked.problems == [] and len(checked.rows) == len(raw) > 0
    held = read(DEMO_VISION_DATA.with_name("heldout.jsonl"))
    trained = {r.images[0] for r in checked.rows}
    assert not trained & {r.images[0] for r in images.check_images(held, DEMO_VISION_DATA.parent).rows}


def test_the_shipped_demo_images_and_rows_are_what_the_generator_draws(tmp_path):
    from core.demo_vision import write_demo_images

    write_demo_images(tmp_path)
    shipped = DEMO_VISION_DATA.parent
    for name in ("train.jsonl", "heldout.jsonl"):
        assert (tmp_path / name).read_text() == (shipped / name).read_text()
    drawn = sorted(p.name for p in (tmp_path / "images").iterdir())
    assert drawn == sorted(p.name for p in (shipped / "images").iterdir())
    for name in drawn:
        with Image.open(tmp_path / "images" / name) as new, Image.open(shipped / "images" / name) as old:
            assert new.tobytes() == old.tobytes(), name
