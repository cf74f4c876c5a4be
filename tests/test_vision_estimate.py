"""Image-text models in the estimate: the image budget applied by each family's processor, the vision tower's 16-bit
weights and kept activations (the formula against autograd's saved tensors of tiny towers on the CPU), the image
tokens of a micro-batch from the processor's counts, and Fit lowering the image budget."""

import json
from types import SimpleNamespace

import pytest
import torch
from PIL import Image

from core.config.settings import TrainConfig, config_problems
from core.data.images import ImageRow, count_tokens
from core.demo_vision import ensure_tiny_model
from core.estimate import vision as ev
from core.estimate.predict import estimate, fit_to_gpu
from core.model import vision
from core.model.shapes import ModelShape, get_shape

QUESTION = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What shape is this?"}]},
            {"role": "assistant", "content": [{"type": "text", "text": "circle"}]}]

# Qwen2.5-VL-7B-Instruct's config.json (bench/archs.py VISION_ARCHS holds the same values)
QWEN25_VL_7B = dict(
    model_type="qwen2_5_vl", vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
    num_attention_heads=28, num_key_value_heads=4, max_position_embeddings=128000, rms_norm_eps=1e-6,
    rope_theta=1000000.0, tie_word_embeddings=False, rope_scaling={"type": "mrope", "mrope_section": [16, 24, 24]},
    image_token_id=151655, video_token_id=151656, vision_start_token_id=151652,
    vision_config=dict(depth=32, hidden_act="silu", hidden_size=1280, intermediate_size=3420, num_heads=16,
                       out_hidden_size=3584, patch_size=14, spatial_merge_size=2, window_size=112,
                       fullatt_block_indexes=[7, 15, 23, 31], temporal_patch_size=2))


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MEMTUNE_CACHE", str(tmp_path / "cache"))


def _saved_in_vision(model, inputs) -> int:
    """Bytes of the distinct storages autograd saves while the vision side runs (parameters excluded)."""
    inside, kept = [False], {}
    for path in vision.vision_modules(model):
        sub = model.get_submodule(path)
        sub.register_forward_pre_hook(lambda *a: inside.__setitem__(0, True))
        sub.register_forward_hook(lambda *a: inside.__setitem__(0, False))
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}

    def pack(t):
        storage = t.untyped_storage()
        if inside[0] and storage.data_ptr() not in params:
            kept[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(**inputs)
    return sum(kept.values())


def _frozen(model):
    """As the recipe trains it: every base weight frozen, the input embeddings' outputs carrying a gradient."""
    for p in model.parameters():
        p.requires_grad_(False)
    model.enable_input_require_grads()
    model.train()
    return model


@pytest.mark.parametrize("family", ["idefics3", "gemma3", "llava"])
def test_the_vision_towers_kept_activations_match_the_formula_within_10_percent(family):
    from transformers import AutoConfig, AutoModelForImageTextToText, AutoProcessor

    folder = ensure_tiny_model(family)
    config = AutoConfig.from_pretrained(folder)
    if hasattr(config.vision_config, "vision_use_head"):  # Gemma-3's config.json: no pooling head
        config.vision_config.vision_use_head = False
    torch.manual_seed(0)
    model = _frozen(AutoModelForImageTextToText.from_config(config, dtype=torch.float32))
    processor = AutoProcessor.from_pretrained(folder)
    messages = [dict(m, content=[dict(p, image=Image.new("RGB", (64, 64), (200, 30, 30))) if p["type"] == "image"
                                 else p for p in m["content"]]) for m in QUESTION[:1]]
    inputs = processor.apply_chat_template([messages], tokenize=True, return_dict=True, return_tensors="pt")
    measured = _saved_in_vision(model, inputs)
    vs = ev.read_vision(config.to_dict())
    image_tokens = int((inputs["input_ids"] == config.image_token_id).sum())
    predicted, _ = ev.kept_bytes(vs, image_tokens * vs.per_token + vs.cls, 4, False)
    assert measured > 0  # the frozen tower keeps activations: its patch embedding's output carries a gradient
    assert abs(predicted - measured) <= 0.1 * measured, (family, predicted, measured)


def test_qwen25_vl_towers_kept_activations_match_the_formula_within_10_percent():
    """The SwiGLU tower with a fused qkv, window attention and the patch merger, fed its flattened patches."""
    from transformers import AutoConfig, AutoModelForImageTextToText

    values = dict(QWEN25_VL_7B, vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                  num_attention_heads=4, num_key_value_heads=2, image_token_id=290, video_token_id=291,
                  vision_start_token_id=292, bos_token_id=1, eos_token_id=2,
                  rope_scaling={"type": "mrope", "mrope_section": [2, 3, 3]},  # half the tiny head's 16
                  vision_config=dict(QWEN25_VL_7B["vision_config"], depth=2, hidden_size=32, intermediate_size=64,
                                     num_heads=2, out_hidden_size=64, fullatt_block_indexes=[1]))
    config = AutoConfig.for_model(values.pop("model_type"), **values)
    torch.manual_seed(0)
    model = _frozen(AutoModelForImageTextToText.from_config(config, dtype=torch.float32))
    grid = torch.tensor([[1, 8, 8]])  # 64 patches of 2 x 3 x 14 x 14 pixels: 16 image tokens
    ids = torch.tensor([[1, 292] + [290] * 16 + [3, 4]])
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "image_grid_thw": grid,
              "pixel_values": torch.randn(64, 3 * 2 * 14 * 14)}
    measured = _saved_in_vision(model, inputs)
    vs = ev.read_vision(config.to_dict())
    predicted, _ = ev.kept_bytes(vs, 64, 4, False)
    assert abs(predicted - measured) <= 0.1 * measured, (predicted, measured)


def test_the_shape_counts_the_language_model_alone_and_the_vision_side_apart():
    from transformers import AutoModelForImageTextToText

    folder = ensure_tiny_model("idefics3")
    shape = get_shape(str(folder))
    model = AutoModelForImageTextToText.from_pretrained(folder)
    own = sum(p.numel() for path in vision.vision_modules(model) for p in model.get_submodule(path).parameters())
    # 7 linears per decoder layer, 4-bit; the vision encoder's and projector's linears stay 16-bit
    assert len(shape.stored.quantizable) == 7 * shape.num_hidden_layers
    assert shape.total_params + own == sum(p.numel() for p in model.parameters())
    assert ev.vision_params(shape) == own


def test_the_estimate_holds_the_16bit_vision_weights_and_grows_with_the_rows_image_tokens():
    shape = get_shape(str(ensure_tiny_model("idefics3")))
    cfg = TrainConfig(model="tiny", load_in_4bit=False, precision="bf16", gradient_checkpointing=False,
                      offload_activations=False, per_device_train_batch_size=2, max_length=256)
    few = estimate(cfg, shape, max_row_tokens=100, image_tokens=16)
    more = estimate(cfg, shape, max_row_tokens=100, image_tokens=32, images_per_row=2)
    assert few.unquantized_weights == 2 * (shape.total_params + ev.vision_params(shape))
    vs = ev.vision_shape(shape)
    grown = ev.kept_bytes(vs, 2 * 32 * vs.per_token, 2, False)[0] - ev.kept_bytes(vs, 2 * 16 * vs.per_token, 2, False)[0]
    assert more.activations - few.activations == grown
    assert any("16 image tokens per row (the dataset's rows" in n for n in few.notes)
    said = estimate(cfg.replace(lora_vision=True), shape, max_row_tokens=100, image_tokens=16).notes
    assert any(n.startswith("lora_vision: the LoRA on the vision encoder") for n in said)  # named, not guessed


def test_the_processor_resizes_to_the_image_budget_and_the_estimate_counts_the_same_tokens():
    """Qwen2-VL's image processor (max_pixels as size.longest_edge) and Idefics3's (longest edge, in tiles)."""
    from transformers import Qwen2VLImageProcessorPil

    photo = Image.new("RGB", (1024, 768), (10, 120, 200))
    holder = vision.apply_image_budget(SimpleNamespace(image_processor=Qwen2VLImageProcessorPil()), 200_704)
    grid = holder.image_processor(images=[photo])["image_grid_thw"][0]
    real = int(grid.prod()) // 4  # patches merged 2 x 2
    vs = ev.read_vision(json.loads(json.dumps(QWEN25_VL_7B)))
    assert real <= ev.tokens_per_image(vs, 200_704) <= 1.1 * real  # the budget's count bounds the real one
    assert ev.tokens_per_image(vs, 200_704) < ev.tokens_per_image(vs, 802_816)

    from transformers import AutoProcessor

    folder = ensure_tiny_model("idefics3")
    counts = []
    for pixels in (64 * 64, 128 * 128):
        processor = vision.apply_image_budget(AutoProcessor.from_pretrained(folder), pixels)
        processor.image_processor.do_image_splitting = True
        counts.append(count_tokens(processor, ImageRow(QUESTION, [Image.new("RGB", (256, 256))]))[1])
    assert counts[0] < counts[1]


def test_a_fixed_size_family_refuses_an_image_budget_by_name_and_a_tiny_budget_is_a_problem():
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(ensure_tiny_model("gemma3"))
    with pytest.raises(vision.ImageBudgetError) as caught:
        vision.apply_image_budget(processor, 200_704)
    assert caught.value.key == "model.err.image_budget_fixed"
    assert vision.apply_image_budget(processor, 0) is processor
    keys = [p.key for p in config_problems(TrainConfig(image_max_pixels=100)) if p.field == "image_max_pixels"]
    assert keys == ["problem.image_max_pixels_small"]


def test_gemma3s_image_tokens_are_counted_as_its_soft_tokens_not_its_begin_of_image():
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(ensure_tiny_model("gemma3"))
    _, image_tokens = count_tokens(processor, ImageRow(QUESTION, [Image.new("RGB", (64, 64))]))
    assert image_tokens == 4  # the tiny model's image_seq_length


def test_fit_lowers_the_image_budget_before_the_length_and_says_so():
    shape = ModelShape.from_config(QWEN25_VL_7B, "Qwen/Qwen2.5-VL-7B-Instruct")
    cfg = TrainConfig(model="Qwen/Qwen2.5-VL-7B-Instruct", max_length=2048, per_device_train_batch_size=1,
                      gradient_checkpointing=True, optim="paged_adamw_8bit", upcast_to_fp32=False)
    full = estimate(cfg, shape)
    fitted, est = fit_to_gpu(cfg, int(full.nvml_peak * 0.97 / 0.9), shape=shape)
    assert 0 < fitted.image_max_pixels < ev.QWEN_DEFAULT_PIXELS
    assert fitted.max_length == 2048
    assert est.notes[0].startswith(f"Fit lowered image_max_pixels to {fitted.image_max_pixels:,}")
    assert est.nvml_peak < full.nvml_peak


def test_the_datasets_real_rows_size_the_estimate(tmp_path):
    from core.config.settings import demo_vision_config

    cfg = demo_vision_config(model=str(ensure_tiny_model("idefics3")))
    found = ev.measured_images(cfg)
    assert found["image_tokens"] == 16 and found["images_per_row"] == 1
    assert 16 < found["max_row_tokens"] <= cfg.max_length


def test_the_bench_builds_its_vision_shapes_with_their_processor_and_writes_photo_rows(tmp_path):
    """bench/synth.py: Gemma-3-12B's shape on the meta device with its processor's token ids, and the image rows the
    plan vision1 trains on, counted by that processor (Qwen2.5-VL's processor needs torchvision: not here)."""
    from bench.archs import VISION_ARCHS
    from bench.product_plans import plan
    from bench.synth import build_vision_model, image_rows

    assert {v.arch for v in plan("vision1")} == set(VISION_ARCHS) and all(v.data == "images" for v in plan("vision1"))
    model, processor = build_vision_model("gemma-3-12b-it", "meta")
    assert round(sum(p.numel() for p in model.parameters()) / 1e9, 2) == 12.19
    assert model.config.image_token_id == processor.tokenizer.image_token_id
    info = image_rows(tmp_path, n_rows=2, n_images=1, size=(320, 240))
    row = json.loads((tmp_path / "train.jsonl").read_text().splitlines()[0])
    assert info["rows"] == 2 and (tmp_path / row["messages"][0]["content"][0]["image"]).is_file()
    rows = ImageRow([{"role": m["role"], "content": [{"type": p["type"], **({"text": p["text"]} if "text" in p else {})}
                                                     for p in m["content"]]} for m in row["messages"]],
                    [str(tmp_path / row["messages"][0]["content"][0]["image"])])
    assert count_tokens(processor, rows)[1] == 256  # Gemma-3: 896 x 896, 256 image tokens whatever the photo


def test_the_web_servers_shape_from_config_keys_keeps_the_vision_side_and_its_formula_count(monkeypatch):
    """Before an inspect child has counted the model (measuring_here(False)): the vision parameters from the widths,
    within 2% of the meta-device count, and the count noted as missing for the child."""
    from core.estimate import measure

    counted = ev.count_params(json.dumps(QWEN25_VL_7B))
    monkeypatch.setattr(measure, "_HERE", False)
    monkeypatch.setattr(measure, "_MEMO", {})  # this process's earlier counts: none
    with measure.collecting() as wants:
        shape = ModelShape.from_keys(QWEN25_VL_7B, "Qwen/Qwen2.5-VL-7B-Instruct")
        formula = ev.vision_params(shape)
    assert abs(formula - counted) <= 0.02 * counted
    assert [spec["kind"] for spec in wants.missing.values()] == ["vision"]


def test_the_estimate_cli_refuses_an_image_budget_for_a_fixed_size_family_by_name(capsys):
    from core.estimate.predict import main

    folder = ensure_tiny_model("gemma3")
    rc = main(["--set", f"model={folder}", "--set", "dataset=assets/demo_vision/train.jsonl",
               "--set", "image_max_pixels=200704", "--data"])
    assert rc == 2 and "resizes every image to one fixed size" in capsys.readouterr().err


def test_the_vision_demo_models_shape_is_read_from_its_own_folder_in_the_server_and_in_a_child(tmp_path, monkeypatch):
    """The page's Vision demo button: the server reads the demo model's config.json from its folder (none before a
    child builds it, never the 'unknown shape' failure), and the inspect child's measurement of its run fails on
    nothing."""
    from core.config.settings import DEMO_VISION_MODEL, demo_vision_config
    from core.estimate import known
    from core.estimate.inspect import inspect

    monkeypatch.setenv("MEMTUNE_HOME", str(tmp_path))
    assert known.config_source(DEMO_VISION_MODEL) is None  # not built yet: a child builds it
    built = ensure_tiny_model()
    assert known.config_source(DEMO_VISION_MODEL) == json.loads((built / "config.json").read_text())
    assert get_shape(DEMO_VISION_MODEL).vocab_size > 0
    assert inspect(demo_vision_config().to_dict(), [])["failed"] == {}
