"""Any model trains exactly what was asked (issue 41): tiny models of families outside README's support matrix.

For each family (tests/families_any.py: soft-caps, sinks, alibi, fused and MLA attention, recurrent, convolutional
and state-space mixers, MoE) and each preset: the config changes memtune decides from config.json and the meta-device
tree alone (core/model/families.py), then, in fp32 on the model's own weights, the pre-flight checks
(core/train/preflight.py) under those changes: packed rows = each row alone and TRL's fused loss = the loss from the
model's own logits (relative 1e-5), or memtune uses the model's own logits (a logit transform the fused head does not
read). One family trains end to end to show the phase, the log lines and summary.json.
"""

from __future__ import annotations

import json
import warnings

import pytest
import torch

from core.config.presets import PRESETS, apply_preset
from core.config.settings import TrainConfig
from core.model import families, lora_targets
from core.model.attention import use_varlen_attention
from core.train import preflight
from tests import families_any

EXACT = 1e-5
FOUND_AT_PREFLIGHT = {"opt"}  # packed rows that see each other, which config.json does not tell


def _rows(seed: int = 1) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, families_any.VOCAB, (n,), generator=g) for n in (7, 5, 9)]


def _packed_batch(rows):
    """One pack of `rows` as TRL's padding-free collator makes it for training (bfd packing)."""
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    ids = torch.cat(rows).tolist()
    collator = DataCollatorForLanguageModeling(pad_token_id=2, padding_free=True)
    return collator([{"input_ids": ids, "seq_lengths": [len(r) for r in rows]}])


def _row_batch(row):
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    return DataCollatorForLanguageModeling(pad_token_id=2)([{"input_ids": row.tolist()}])


@pytest.mark.parametrize("name", families_any.NAMES)
def test_every_preset_trains_exactly_what_was_asked(name):
    from accelerate import init_empty_weights
    from transformers import AutoModelForCausalLM
    from trl.trainer.utils import add_fused_lm_head

    config = families_any.hf_config(name)
    with init_empty_weights():
        tree = AutoModelForCausalLM.from_config(config)
    found = families.traits(config, tree)
    rows = _rows()
    checked = set()
    for preset in PRESETS:
        cfg = apply_preset(TrainConfig(), preset)
        changes, said = families.adapt(cfg, found)
        cfg = cfg.replace(**changes)
        assert all(s.key.startswith("log.adapt.") for s in said)
        if found.mixers:  # a state carried from token to token never crosses packed rows
            assert not cfg.packing, (name, preset)
        if cfg.attention == "varlen":
            assert cfg.packing and found.attention_backend and not found.alibi, (name, preset)
        key = (cfg.packing, cfg.attention)
        if key in checked:
            continue
        checked.add(key)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = families_any.model(name)
            if cfg.attention == "varlen":
                use_varlen_attention(model)
            add_fused_lm_head(model, outputs=("log_probs", "entropy", "is_top1"))
            with torch.no_grad():
                packed = cfg.packing
                if packed:
                    apart = preflight.rows_apart(model, [_packed_batch(rows)], "cpu")
                    assert apart["rows"] == 3, apart
                    if apart["error"] > preflight.ROW_TOLERANCE["fp32"]:
                        # found only on the model itself (OPT's mask under sdpa/eager): the pre-flight unpacks
                        assert name in FOUND_AT_PREFLIGHT, (name, preset, apart)
                        packed = False
                    else:
                        assert apart["error"] <= EXACT, (name, preset, apart)
                loss = preflight.loss_paths(model, _packed_batch(rows) if packed else _row_batch(rows[2]), "cpu")
        if found.unread_logit:  # the fused head drops it: the pre-flight makes the model's own logits the loss
            assert families.traits(model.config).unread_logit == found.unread_logit
        else:
            assert loss["error"] <= EXACT, (name, preset, loss)


# What config.json alone decides (before any weight loads), per family
EXPECTED = {
    "lfm2": dict(mixers=True), "qwen3_next": dict(mixers=True), "granitemoehybrid": dict(mixers=True),
    "recurrent_gemma": dict(mixers=True, unread=True), "bloom": dict(alibi=True, unpacked=True),
    "mpt": dict(alibi=True, unpacked=True), "falcon-alibi": dict(alibi=True), "gpt_oss": dict(sinks=True),
}


@pytest.mark.parametrize("name", families_any.NAMES)
def test_config_alone_names_the_features_that_decide(name):
    from accelerate import init_empty_weights
    from transformers import AutoModelForCausalLM

    config = families_any.hf_config(name)
    with init_empty_weights():
        found = families.traits(config, AutoModelForCausalLM.from_config(config))
    want = EXPECTED.get(name, {})
    assert bool(found.mixers) == want.get("mixers", False), found
    assert found.alibi == want.get("alibi", False), found
    assert found.sinks == want.get("sinks", False), found
    assert bool(found.unread_logit) == want.get("unread", False), found
    fastest = apply_preset(TrainConfig(), "fastest")
    changes, _ = families.adapt(fastest, found)
    assert changes.get("packing", True) is (not (want.get("mixers") or want.get("unpacked"))), changes
    if name == "gpt_oss":  # packed rows with sdpa: the sinks run per packed row (varlen's own-eager path)
        sdpa = apply_preset(TrainConfig(), "lowest_memory").replace(attention="sdpa")
        assert families.adapt(sdpa, found)[0] == {"attention": "varlen"}


@pytest.mark.parametrize("name", families_any.NAMES)
def test_lora_q_k_v_o_lands_on_the_attention_blocks_input_and_output_projections(name):
    from accelerate import init_empty_weights
    from transformers import AutoModelForCausalLM

    with init_empty_weights():
        tree = AutoModelForCausalLM.from_config(families_any.hf_config(name))
    linear = lora_targets.linear_layers(tree)
    chapter = lora_targets.resolve(["q_proj", "k_proj", "v_proj", "o_proj"], linear, 8)
    group = lora_targets.resolve(["attention"], linear, 8)
    assert set(chapter.modules) == set(group.modules), (chapter.modules, group.modules)
    assert len(chapter.modules) >= 2  # an input and an output projection at least
    landed = lora_targets.paths(tree, chapter.modules)
    assert landed and all(lora_targets._in_attention(tree, p) for p in landed), landed
    outputs = [m for m in chapter.modules if lora_targets._leaf(m) in lora_targets.OUTPUTS]
    assert outputs, chapter.modules  # the output projection (o_proj, dense, out_proj, c_proj, ...) is never dropped


def _folder(name, tmp_path):
    from core.demo import ensure_demo_model

    folder = tmp_path / name
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        families_any.model(name).save_pretrained(folder)
    for f in ensure_demo_model().iterdir():
        if "token" in f.name:
            (folder / f.name).write_bytes(f.read_bytes())
    return folder


def _cpu(folder, tmp_path, preset):
    from core.config.settings import demo_config

    cfg = apply_preset(demo_config(model=str(folder), output_dir=str(tmp_path / "runs")), preset)
    return cfg.replace(use_liger_kernel=False, offload_activations=False, offload_embeddings=False, precision="fp32",
                       load_in_4bit=False, optim="adamw_torch", max_steps=1, device="cpu",
                       lora_target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])


def test_packed_rows_that_see_each_other_are_found_before_step_1_and_train_unpacked(tmp_path):
    """OPT's mask under sdpa ignores packed rows (config.json cannot tell): the pre-flight finds it on the model
    itself before the trainer is built, says so, and the run trains unpacked (tests/test_resolve.py: one trainer)."""
    from core.train.recipe import run_training

    events = []
    cfg = _cpu(_folder("opt", tmp_path), tmp_path, "lowest_memory").replace(attention="sdpa")  # transformers' mask
    result = run_training(cfg, sink=events.append)
    assert result.status == "completed", result.message
    pre = result.summary["preflight"]
    assert pre["switched_to"] == "unpacked" and pre["rows"]["error"] > pre["tolerance"]["rows"], pre
    assert pre["loss_path"] == "fused" and pre["loss"]["error"] <= EXACT
    assert [e["key"] for e in events if e.get("key", "").startswith("log.preflight.")] == [
        "log.preflight.unpacked", "log.preflight.done"]


def test_a_soft_capped_recurrent_model_trains_unpacked_on_its_own_logits(tmp_path):
    """recurrent_gemma under lowest_memory: config.json turns packing off before loading (said in the log); the
    pre-flight phase runs before step 1, switches the loss to the model's own logits (its logits_soft_cap, which
    TRL's fused head does not read), and summary.json records it."""
    from core.config.settings import demo_config
    from core.demo import ensure_demo_model
    from core.train.recipe import run_training

    folder = tmp_path / "rg"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        families_any.model("recurrent_gemma").save_pretrained(folder)
    for f in ensure_demo_model().iterdir():
        if "token" in f.name:
            (folder / f.name).write_bytes(f.read_bytes())
    events = []
    cfg = apply_preset(demo_config(model=str(folder), output_dir=str(tmp_path / "runs"), max_steps=1,
                                   precision="fp32", load_in_4bit=False, optim="adamw_torch", device="cpu"),
                       "lowest_memory").replace(use_liger_kernel=False, offload_activations=False, precision="fp32",
                                                load_in_4bit=False, optim="adamw_torch", max_steps=1)
    result = run_training(cfg, sink=events.append)
    assert result.status == "completed", result.message
    keys = [e.get("key") for e in events]
    assert "log.adapt.unpacked_mixer" in keys and "log.preflight.own_head" in keys
    phases = [e for e in events if e.get("kind") == "phase" and e.get("phase") == "preflight"]
    assert phases and keys.index("log.phase.preflight") < keys.index("log.preflight.done")
    summary = json.loads((tmp_path / "runs").glob("*/summary.json").__next__().read_text())
    pre = summary["preflight"]
    assert pre["loss_path"] == "own_logits" and pre["lora"]["layers"] > 0 and not pre["lora"]["unasked"]
    assert "rows" not in pre and pre["adapted"][0]["key"] == "log.adapt.unpacked_mixer"  # trained unpacked
    assert not any("Traceback" in (e.get("message") or "") for e in events)
