"""GGUF export, end to end on the CPU: a tiny demo adapter is trained, merged and written as f16 and q8_0 in one
call; the files are read back with the `gguf` package's reader and loaded with transformers' GGUF loader, whose
logits must match the merged model's (f16: up to float16 rounding of the bf16 merged weights; q8_0: within the
tolerance stated in test_q8_0_logits). Tiny Qwen2 and Mistral models check the other mappings the same way.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from core.export.gguf import GGUFError, llama3_rope_factors, parse_formats
from core.export.gguf_export import export_gguf, plan_gguf

ROOT = Path(__file__).resolve().parent.parent
PROMPTS = ["### Instruction:\nTranslate the word 'cat' into French.\n\n### Response:\nchat",
           "### Instruction:\nWhat is the French word for 'sun'?\n\n### Response:\n"]


@pytest.fixture(scope="module")
def adapter(tmp_path_factory, finished_run) -> Path:
    """A copy of the session's finished demo run (the export writes its gguf/ folder into the run's folder)."""
    import shutil

    run = Path(finished_run.result.run_dir)
    copy = Path(shutil.copytree(run, tmp_path_factory.mktemp("runs") / run.name))
    return copy / Path(finished_run.result.adapter_dir).relative_to(run)


@pytest.fixture(scope="module")
def exported(adapter):
    events = []
    result = export_gguf(adapter_dir=adapter, formats="f16,q8_0", progress=lambda f, m: events.append((f, m)))
    return result, events


@pytest.fixture(scope="module")
def merged(adapter, tmp_path_factory) -> Path:
    from core.export.adapter import merge_adapter

    return merge_adapter(adapter, tmp_path_factory.mktemp("merged") / "m")


def _logits(model, tokenizer) -> list[torch.Tensor]:
    with torch.no_grad():
        return [model(tokenizer(p, return_tensors="pt")["input_ids"]).logits[0] for p in PROMPTS]


def _max_diff(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return max((x - y).abs().max().item() for x, y in zip(a, b))


def _gguf_model(path: Path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)


def _reference(folder: Path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(folder)


def test_one_call_writes_both_files_modelfile_readme_and_no_temp(exported, adapter):
    result, events = exported
    run_dir = adapter.parent
    assert result.out_dir == run_dir / "gguf"
    assert sorted(result.files) == ["f16", "q8_0"]
    names = sorted(p.name for p in result.out_dir.iterdir())
    assert names == sorted([*(p.name for p in result.files.values()), "Modelfile", "README.md", ".memtune.json"])
    assert result.files["q8_0"].stat().st_size < 0.65 * result.files["f16"].stat().st_size
    leftovers = [p for p in run_dir.iterdir() if p.name.startswith(".") and p.name != ".memtune.json"]
    assert not leftovers, "a temporary folder was left behind"
    modelfile = result.modelfile.read_text()
    assert f"FROM ./{result.files['q8_0'].name}" in modelfile  # the smallest file
    assert "### Instruction:\n{{ template" in modelfile  # the demo has no chat template: memtune's prompt
    assert 'PARAMETER stop "</s>"' in modelfile
    readme = result.readme.read_text()
    for command in result.commands:  # the README's run in its own folder: no absolute path
        assert command.replace(f"{result.out_dir}/", "") in readme and str(result.out_dir) not in readme
    assert result.commands[0].startswith("ollama create ") and result.commands[0].endswith("/Modelfile")
    assert any(c.startswith("llama-cli -m ") and result.files["f16"].name in c for c in result.commands)
    # progress: starts with the RAM/disk plan, only goes forward, ends at 100 %
    assert events[0][1].startswith("Needs about") and "RAM" in events[0][1] and "disk" in events[0][1]
    fractions = [f for f, _ in events]
    assert fractions == sorted(fractions) and fractions[-1] == 1.0
    marker = json.loads((result.out_dir / ".memtune.json").read_text())
    assert marker["kind"] == "export" and marker["what"] == "gguf"
    assert marker["formats"] == ["f16", "q8_0"]
    assert result.commands[0].startswith(f"ollama create {marker['ollama_name']} -f ")


def test_reader_sees_names_shapes_dtypes_and_metadata(exported, demo_model_path):
    from gguf import GGMLQuantizationType as Q
    from gguf import GGUFReader

    result, _ = exported
    config = json.loads((demo_model_path / "config.json").read_text())
    spec = json.loads((demo_model_path / "tokenizer.json").read_text())
    per_layer = ["attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down", "attn_norm",
                 "ffn_norm"]
    expected = {"token_embd.weight", "output_norm.weight", "output.weight"} | {
        f"blk.{i}.{n}.weight" for i in range(config["num_hidden_layers"]) for n in per_layer}
    hidden, inter, vocab = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    kv = config["num_key_value_heads"] * hidden // config["num_attention_heads"]
    shapes = {"token_embd.weight": [hidden, vocab], "output.weight": [hidden, vocab], "blk.0.attn_k.weight": [hidden, kv],
              "blk.0.ffn_down.weight": [inter, hidden], "blk.1.attn_norm.weight": [hidden]}  # GGUF lists ne: cols first
    for fmt, matrix_type in (("f16", Q.F16), ("q8_0", Q.Q8_0)):
        reader = GGUFReader(result.files[fmt])
        tensors = {t.name: t for t in reader.tensors}
        assert set(tensors) == expected
        for name, shape in shapes.items():
            assert list(tensors[name].shape) == shape, name
        for name, tensor in tensors.items():
            assert tensor.tensor_type == (Q.F32 if name.endswith("norm.weight") else matrix_type), name

        def field(key):
            f = reader.fields[key]
            return f.contents()

        assert field("general.architecture") == "llama"
        assert field("llama.block_count") == config["num_hidden_layers"]
        assert field("llama.context_length") == config["max_position_embeddings"]
        assert field("llama.embedding_length") == hidden and field("llama.feed_forward_length") == inter
        assert field("llama.attention.head_count") == config["num_attention_heads"]
        assert field("llama.attention.head_count_kv") == config["num_key_value_heads"]
        assert field("llama.rope.dimension_count") == hidden // config["num_attention_heads"]
        assert field("llama.attention.layer_norm_rms_epsilon") == pytest.approx(config["rms_norm_eps"])
        assert field("tokenizer.ggml.model") == "gpt2" and field("tokenizer.ggml.pre") == "gpt-2"
        tokens = field("tokenizer.ggml.tokens")
        assert len(tokens) == vocab and tokens[:3] == ["<s>", "</s>", "<pad>"]
        assert field("tokenizer.ggml.token_type")[:4] == [3, 3, 3, 1]  # the specials are CONTROL
        assert len(field("tokenizer.ggml.merges")) == len(spec["model"]["merges"])
        assert (field("tokenizer.ggml.bos_token_id"), field("tokenizer.ggml.eos_token_id")) == (0, 1)
        assert field("tokenizer.ggml.add_bos_token") is True
        assert field("general.file_type") == (1 if fmt == "f16" else 7)


def test_transformers_gguf_tokenizer_matches_the_demo_tokenizer(exported, demo_tokenizer):
    from transformers import AutoTokenizer

    path = exported[0].files["f16"]
    tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    for text in [*PROMPTS, "  odd   spacing\n\nand ünïcödé ✓"]:
        assert tok(text)["input_ids"] == demo_tokenizer(text)["input_ids"], text
        assert tok.decode(tok(text)["input_ids"], skip_special_tokens=True) == text


def test_f16_logits_match_the_merged_model(exported, merged):
    """The merged weights are bf16; every bf16 value in the normal range is exact in f16, so the GGUF model is the
    merged model up to the rare subnormal: logits agree to float32 round-off."""
    ref = _logits(*_reference(merged))
    got = _logits(*_gguf_model(exported[0].files["f16"]))
    diff = _max_diff(ref, got)
    print(f"f16 max |logit difference| = {diff:.3g}")
    assert diff < 1e-3


def test_q8_0_logits_within_stated_tolerance(exported, merged):
    """Q8_0 keeps 8 bits per weight and one f16 scale per block of 32 (weight error <= 1/254 of the block's
    largest). Two checks:
    - exact: the file is the merged model with every matrix quantized by the gguf package's Q8_0 quantizer
      (logits equal those of that model to float32 round-off, 1e-4);
    - stated tolerance against the unquantized merged model: mean |logit difference| <= 5 % of the logits'
      standard deviation, max <= 10 % of their range, and the same top token wherever the reference's top two
      are further apart than that max. (Measured on the demo: mean 3.3 % of std, max 5.7 % of range; the demo's
      deliberately large random weights, init 0.3, amplify rounding more than a pretrained model does.)"""
    import gguf

    model, tokenizer = _reference(merged)
    ref = _logits(model, tokenizer)
    got = _logits(*_gguf_model(exported[0].files["q8_0"]))
    q8 = gguf.GGMLQuantizationType.Q8_0
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.copy_(torch.from_numpy(gguf.quants.dequantize(gguf.quants.quantize(p.numpy(), q8), q8)))
    simulated = _logits(model, tokenizer)
    assert _max_diff(simulated, got) < 1e-4
    diff = _max_diff(ref, got)
    mean = max((r - g).abs().mean().item() for r, g in zip(ref, got))
    std = min(r.std().item() for r in ref)
    span = min((r.max() - r.min()).item() for r in ref)
    print(f"q8_0 |logit difference|: max {diff:.3g} ({diff / span:.1%} of range), mean {mean:.3g} "
          f"({mean / std:.1%} of std)")
    assert mean <= 0.05 * std and diff <= 0.10 * span
    for r, g in zip(ref, got):
        top2 = r.topk(2, dim=-1).values
        clear = (top2[:, 0] - top2[:, 1]) > diff
        assert torch.equal(r.argmax(-1)[clear], g.argmax(-1)[clear])


def _tiny_model(folder: Path, arch: str, demo_model_path: Path, **extra) -> Path:
    import transformers
    from transformers import AutoTokenizer

    config_cls = {"qwen2": transformers.Qwen2Config, "mistral": transformers.MistralConfig,
                  "llama": transformers.LlamaConfig}[arch]
    model_cls = {"qwen2": transformers.Qwen2ForCausalLM, "mistral": transformers.MistralForCausalLM,
                 "llama": transformers.LlamaForCausalLM}[arch]
    tok = AutoTokenizer.from_pretrained(demo_model_path)
    config = config_cls(vocab_size=len(tok) + 8, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                        bos_token_id=0, eos_token_id=1, tie_word_embeddings=arch == "qwen2", **extra)
    torch.manual_seed(0)
    model = model_cls(config)
    for p in model.parameters():  # biases too (Qwen2 has q/k/v biases): non-zero so their mapping shows
        torch.nn.init.normal_(p, std=0.2)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


@pytest.mark.parametrize("arch", ["qwen2", "mistral"])
def test_other_architectures_round_trip_in_f32(arch, tmp_path, demo_model_path):
    """Qwen2 (biases, tied embeddings, no q/k permutation) and Mistral (llama.cpp's llama): lossless f32 files
    load back with identical logits, so the tensor mapping is exact; 8 padding rows become [PAD] tokens."""
    from gguf import GGUFReader

    folder = _tiny_model(tmp_path / f"tiny-{arch}", arch, demo_model_path)
    result = export_gguf(model_dir=folder, formats=["f32"])
    path = result.files["f32"]
    reader = GGUFReader(path)
    names = {t.name for t in reader.tensors}
    assert reader.fields["general.architecture"].contents() == ("qwen2" if arch == "qwen2" else "llama")
    assert ("blk.0.attn_q.bias" in names) == (arch == "qwen2")
    assert ("output.weight" in names) == (arch != "qwen2")  # tied: llama.cpp reuses token_embd
    assert reader.fields["tokenizer.ggml.tokens"].contents()[-1].startswith("[PAD")
    diff = _max_diff(_logits(*_reference(folder)), _logits(*_gguf_model(path)))
    print(f"{arch} f32 max |logit difference| = {diff:.3g}")
    assert diff < 1e-4


def test_llama3_rope_scaling_becomes_rope_freqs(tmp_path, demo_model_path):
    """Llama-3.1's rope scaling: llama.cpp divides each frequency by rope_freqs; they must be transformers' own
    default/scaled inverse-frequency ratios."""
    from gguf import GGUFReader
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    rope = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
    folder = _tiny_model(tmp_path / "tiny-llama3", "llama", demo_model_path, rope_parameters=rope)
    config = LlamaConfig.from_pretrained(folder)
    scaled, _ = ROPE_INIT_FUNCTIONS["llama3"](config, "cpu")
    dim = 64 // 4
    default = 1.0 / (500000.0 ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    expected = (default / scaled.double()).numpy()
    ours = llama3_rope_factors(json.loads((folder / "config.json").read_text()))
    np.testing.assert_allclose(ours, expected, rtol=1e-5)
    assert len(set(np.round(ours, 4))) > 2  # the test range hits all three branches (1, smooth, factor)
    path = export_gguf(model_dir=folder, formats=["f16"]).files["f16"]
    tensors = {t.name: t for t in GGUFReader(path).tensors}
    np.testing.assert_allclose(np.asarray(tensors["rope_freqs.weight"].data), ours)


def test_refusals_say_what_is_supported(tmp_path, adapter):
    from transformers import GPT2Config, GPT2LMHeadModel

    folder = tmp_path / "gpt2"
    GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64, bos_token_id=0, eos_token_id=0)).save_pretrained(folder)
    with pytest.raises(GGUFError, match="supports Llama.*Mistral.*Qwen2.*GPT2LMHeadModel"):
        export_gguf(model_dir=folder, formats="f16")
    with pytest.raises(GGUFError, match="q4_k.*choose one or more of f16, bf16, q8_0"):
        parse_formats("f16,q4_k")
    assert parse_formats(" Q8_0 ,f16,q8_0") == ["q8_0", "f16"]
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")
    with pytest.raises(GGUFError, match="not made by memtune"):
        export_gguf(adapter_dir=adapter, formats="q8_0", out_dir=foreign, overwrite=True)
    assert (foreign / "notes.txt").read_text() == "keep me"
    with pytest.raises(GGUFError, match="not made by memtune"):  # with or without Replace: the plan says so
        export_gguf(adapter_dir=adapter, formats="q8_0", out_dir=foreign)


def test_not_enough_disk_is_refused_before_anything_is_written(tmp_path, adapter, monkeypatch):
    import shutil

    import core.export.gguf_export as ge

    real = shutil.disk_usage
    monkeypatch.setattr(ge.shutil, "disk_usage", lambda p: real(p)._replace(free=1000))
    plan = plan_gguf(adapter_dir=adapter, formats="f16,q8_0", out_dir=tmp_path / "out")
    assert not plan.ok and "Not enough disk" in plan.message and plan.file_bytes["q8_0"] < plan.file_bytes["f16"]
    with pytest.raises(GGUFError, match="Not enough disk"):
        export_gguf(adapter_dir=adapter, formats="f16,q8_0", out_dir=tmp_path / "out")
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out*"))


def test_cli_help_and_export(tmp_path, adapter, capsys):
    from core.export.cli import main  # in this process: a fresh one would spend seconds importing torch again

    for argv, expected in ((["--help"], ("gguf", "Ollama")), (["gguf", "--help"], ("q8_0", "--formats"))):
        with pytest.raises(SystemExit) as exit_:
            main(argv)
        out = capsys.readouterr().out
        assert exit_.value.code == 0 and all(word in out for word in expected), out
    assert main(["gguf", str(adapter), "--formats", "q8_0", "--out", str(tmp_path / "g")]) == 0
    done = capsys.readouterr()
    assert "[100.0%]" in done.out and "ollama create" in done.out and "llama-cli" in done.out, done.err[-2000:]
    assert len(list((tmp_path / "g").glob("*-q8_0.gguf"))) == 1
    # The real entry point once: `python -m core.export`'s exit status and its one-line error.
    bad = subprocess.run([sys.executable, "-m", "core.export", "gguf", str(adapter), "--formats", "q3"], cwd=ROOT,
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "Unknown GGUF format" in bad.stderr and "Traceback" not in bad.stderr


def test_plan_predicts_each_file_within_10_percent(exported, adapter, tmp_path):
    """The sizes the page and --plan announce are the files' sizes (tensor data + vocabulary, merges, template)."""
    plan = plan_gguf(adapter_dir=adapter, formats="f16,q8_0", out_dir=tmp_path / "never")
    for fmt, path in exported[0].files.items():
        real = path.stat().st_size
        assert abs(plan.file_bytes[fmt] - real) <= 0.10 * real, (fmt, plan.file_bytes[fmt], real)
    again = plan_gguf(adapter_dir=adapter, formats="q8_0", out_dir=exported[0].out_dir)
    assert again.replaces and "replaces it (Replace, --replace)" in again.message
    assert not plan.replaces


def test_token_types_follow_llama_cpp_converter_order(tmp_path, demo_model_path):
    """Byte tokens are BYTE before any added-token rule (gguf's LlamaHfVocab), special-looking added tokens are
    CONTROL (does_token_look_special), other added tokens USER_DEFINED; a tokenizer without a BOS token takes
    config.json's bos_token_id, as llama.cpp's converter writes it for Qwen2."""
    import shutil

    from core.export.gguf import (TOKEN_BYTE, TOKEN_CONTROL, TOKEN_NORMAL, TOKEN_USER_DEFINED, _token_type,
                           tokenizer_metadata)

    added = {"<0x0A>": {"special": True}, "<|im_end|>": {"special": False}, "<custom>": {"special": False},
             "<s>": {"special": True}}
    assert _token_type("<0x0A>", 5, "llama", added, 0) == TOKEN_BYTE
    assert _token_type("<|im_end|>", 6, "gpt2", added, None) == TOKEN_CONTROL
    assert _token_type("<custom>", 7, "gpt2", added, None) == TOKEN_USER_DEFINED
    assert _token_type("<s>", 1, "gpt2", added, None) == TOKEN_CONTROL
    assert _token_type("hello", 9, "gpt2", added, None) == TOKEN_NORMAL
    folder = Path(shutil.copytree(demo_model_path, tmp_path / "no-bos"))
    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    cfg["bos_token"] = None
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg))
    config = json.loads((folder / "config.json").read_text())
    meta = tokenizer_metadata(folder, config["vocab_size"])
    assert meta["bos"] == config["bos_token_id"] == 0 and meta["add_bos"] is False


def test_export_tab_handlers(adapter, tmp_path):
    """The page's GGUF handlers: the plan before, refusals, and the files + commands after (no browser)."""
    import shutil

    from ui.gguf import on_gguf_export, on_gguf_plan
    from ui.state import AppState

    app = AppState()  # its own manager: the export runs in that manager's child

    adapter = Path(shutil.copytree(adapter, tmp_path / "run-copy" / "adapter"))  # its own gguf/ folder
    plan = on_gguf_plan("pt", str(adapter), ["f16", "q8_0"])
    assert "Precisa de cerca de" in plan and "mt-note-ok" in plan and "q8_0" in plan
    assert "Choisissez au moins un format" in on_gguf_plan("fr", str(adapter), [])
    assert on_gguf_plan("en", None, ["f16"]) == ""
    status, commands = on_gguf_export(app, "en", None, ["f16"], False, progress=None)
    assert "Pick" in status or "pick" in status
    status, commands = on_gguf_export(app, "en", str(adapter), ["q8_0"], True, progress=None)
    assert "GGUF export done" in status and "-q8_0.gguf" in status and "Modelfile" in status
    assert commands["visible"] and commands["value"].startswith("ollama create ")
    assert "llama-cli -m " in commands["value"] and "llama-completion -m " in commands["value"]
    again = on_gguf_plan("fr", str(adapter), ["q8_0"])  # said before the click: this export would replace one
    assert "mt-note-warn" in again and "--replace" in again and "export GGUF" in again


def test_family_settings_llama_cpp_would_run_differently_are_refused():
    """Settings llama.cpp hard-codes per family are checked, not silently exported wrong."""
    from core.export.gguf import GGUFError, _family_metadata

    gemma = dict(architectures=["Gemma2ForCausalLM"], num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                 head_dim=32, query_pre_attn_scalar=64)
    with pytest.raises(GGUFError, match="query_pre_attn_scalar is 64.*1/sqrt\\(32\\)"):
        _family_metadata(None, gemma, "gemma2", 32)
    smol = dict(architectures=["SmolLM3ForCausalLM"], num_hidden_layers=4, no_rope_layers=[1, 0, 1, 1])
    with pytest.raises(GGUFError, match="every 4th"):
        _family_metadata(None, smol, "smollm3", 16)
    phi = dict(architectures=["Phi3ForCausalLM"], num_hidden_layers=2,
               rope_parameters={"rope_type": "longrope", "long_factor": [1.0], "short_factor": [1.0]})
    with pytest.raises(GGUFError, match="longrope.*128k"):
        _family_metadata(None, phi, "phi3", 16)
    from core.export.gguf import family

    for name in ("MixtralForCausalLM", "Gemma3ForConditionalGeneration"):
        with pytest.raises(GGUFError, match=name):
            family({"architectures": [name]})


def test_sentencepiece_style_tokenizer_round_trips(tmp_path):
    """Llama-2 / Mistral-7B style vocabularies (BPE with byte fallback and '▁' for spaces) become llama.cpp's
    "llama" tokenizer: tokens, scores (earlier pieces merge first), types (unknown, control, byte) and merges;
    transformers' GGUF loader rebuilds a tokenizer that encodes exactly as the original."""
    from gguf import GGUFReader
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM, LlamaTokenizer

    from core.demo import demo_rows

    corpus = [f"### Instruction:\n{r['instruction']}\n\n### Response:\n{r['response']}" for r in demo_rows()]
    specials = ["<unk>", "<s>", "</s>", *(f"<0x{i:02X}>" for i in range(256))]
    bpe = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
    bpe.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    bpe.train_from_iterator(corpus, trainer=trainers.BpeTrainer(vocab_size=600, special_tokens=specials,
                                                                show_progress=False))
    spec = json.loads(bpe.to_str())["model"]
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in spec["merges"]]
    tok = LlamaTokenizer(vocab=spec["vocab"], merges=merges, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    folder = tmp_path / "tiny-llama2"
    config = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(folder)
    tok.save_pretrained(folder)
    path = export_gguf(model_dir=folder, formats=["f32"]).files["f32"]
    fields = GGUFReader(path).fields
    assert fields["tokenizer.ggml.model"].contents() == "llama"
    assert fields["tokenizer.ggml.token_type"].contents()[:5] == [2, 3, 3, 6, 6]  # <unk>, <s>, </s>, <0x00>, <0x01>
    assert fields["tokenizer.ggml.scores"].contents()[:3] == [0.0, -1.0, -2.0]
    back = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    reference = AutoTokenizer.from_pretrained(folder)
    for text in [*corpus[:3], "  odd   spacing\n\nand ünïcödé ✓"]:
        assert back(text)["input_ids"] == reference(text)["input_ids"], text
    diff = _max_diff(_logits(*_reference(folder)), _logits(*_gguf_model(path)))
    assert diff < 1e-4


# Real chat templates, as llama.cpp records them (its models/templates; tests/llama/templates/README.md)
CHAT_TEMPLATES = sorted((ROOT / "tests" / "llama" / "templates").glob("*.jinja"))
CONVERSATIONS = [
    [{"role": "user", "content": "Translate the word 'cat' into French."}],
    [{"role": "system", "content": "Answer in one word."}, {"role": "user", "content": "What is 'sun' in French?"}],
    [{"role": "user", "content": "Hi!"}, {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Bye?"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "One"}, {"role": "assistant", "content": "Two"},
     {"role": "user", "content": "Three"}],
]


def _with_template(demo_model_path, template: str | None):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(demo_model_path)
    tok.chat_template = template
    return tok


@pytest.mark.parametrize("path", CHAT_TEMPLATES, ids=lambda p: p.stem)
def test_ollama_template_renders_what_the_chat_template_renders(path, demo_model_path):
    """The Modelfile's TEMPLATE, rendered as Ollama renders it (tests/ollama_go.py), is the HF chat template's
    text for the same messages: default system turns (Qwen2.5's, Llama-3.1's date header) and end-of-turn tokens
    included; Mistral-Nemo's system text inside the last user turn; Gemma-2's, which takes no system turn, folded
    into the first user turn as llama.cpp folds it."""
    from core.export.gguf_export import chat_pieces, folded, go_chat_template
    from tests import ollama_go

    tok = _with_template(demo_model_path, path.read_text(encoding="utf-8"))

    def hf(messages, generation=True):
        return tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation)

    go = go_chat_template(chat_pieces(hf), bos=None)
    rendered = ollama_go.render_template(go, CONVERSATIONS)  # Ollama's own template code (tests/go)
    for messages, text in zip(CONVERSATIONS, rendered):
        if "gemma" in path.stem and messages[0]["role"] == "system":  # Gemma's template refuses system turns
            with pytest.raises(Exception, match="System role not supported"):
                hf(messages)
            assert text == hf(folded(messages)), messages
            continue
        assert text == hf(messages), messages
    if "Qwen2.5" in path.stem:  # the default system turn the old Modelfile left out
        assert "You are Qwen, created by Alibaba Cloud." in rendered[0]


def test_memtune_chat_template_is_the_training_prompt(demo_model_path):
    """Base models get memtune's own prompt format as their GGUF chat template: rendered by transformers (Jinja, as
    llama.cpp and chat front-ends render it) it is exactly what core.data.formats trains on, for one turn, a system
    turn, several turns, and a finished conversation (+ the answer and EOS)."""
    from core.data.formats import _render_default
    from core.export.gguf import MEMTUNE_CHAT_TEMPLATE

    tok = _with_template(demo_model_path, MEMTUNE_CHAT_TEMPLATE)
    for messages in CONVERSATIONS + [[{"role": "user", "content": "  spaced  "}]]:
        prompt, _ = _render_default([*messages, {"role": "assistant", "content": "x"}])
        assert tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) == prompt
        full = [*messages, {"role": "assistant", "content": "Le chat"}]
        assert tok.apply_chat_template(full, tokenize=False) == prompt + "Le chat" + tok.eos_token
    # the Modelfile's plain template: rendered by Ollama's own code in tests/test_modelfile.py


def test_export_writes_the_model_chat_template_and_a_matching_modelfile(tmp_path, demo_model_path):
    """A chat model's GGUF keeps its own chat template; its Modelfile's TEMPLATE renders the same text (Qwen2.5's
    default system turn included), stops at its end-of-turn token and samples greedily; Mistral-Nemo's template
    gets one too (Ollama renders it in tests/test_templates_ollama.py)."""
    import re

    from gguf import GGUFReader

    from tests import gotemplate

    folder = _tiny_model(tmp_path / "tiny-qwen-chat", "qwen2", demo_model_path)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    tok.add_tokens(["<|im_start|>", "<|im_end|>"], special_tokens=True)
    qwen = (ROOT / "tests" / "llama" / "templates" / "Qwen-Qwen2.5-7B-Instruct.jinja").read_text(encoding="utf-8")
    tok.chat_template = qwen
    tok.save_pretrained(folder)
    result = export_gguf(model_dir=folder, formats="f32")
    fields = GGUFReader(result.files["f32"]).fields
    assert fields["tokenizer.chat_template"].contents() == qwen
    modelfile = result.modelfile.read_text()
    template = re.search(r'TEMPLATE """(.*?)"""', modelfile, re.S).group(1)
    for messages in CONVERSATIONS:
        assert gotemplate.render(template, messages) == tok.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True)
    assert 'PARAMETER stop "<|im_end|>"' in modelfile and "PARAMETER temperature 0" in modelfile
    assert "PARAMETER repeat_penalty 1" in modelfile
    tok.chat_template = (ROOT / "tests" / "llama" / "templates" /
                         "mistralai-Mistral-Nemo-Instruct-2407.jinja").read_text(encoding="utf-8")
    tok.save_pretrained(folder)
    modelfile = export_gguf(model_dir=folder, formats="f32", overwrite=True).modelfile.read_text()
    assert "[INST]" in re.search(r'TEMPLATE """(.*?)"""', modelfile, re.S).group(1)
