"""Try it on the CPU with the real stack: the demo trained for a few steps, reloaded from its adapter folder.

Nothing is mocked: adapters come from core.train.recipe.run_training, models from core.model.load.load_with_adapter.
"""

import gc
import weakref

import pytest
import torch
from safetensors.torch import load_file

from core.config.settings import demo_config
from core.data.plan import load_raw
from core.infer import Comparer, InferError, adapter_config, format_prompt, generate_stream
from core.train.recipe import run_training
from tests.helpers import rendered_rows

PROMPT = "Translate the word 'cat' into French."


def lora_adapter_names(model) -> set[str]:
    """Names of the LoRA adapters present in a model's layers (one set, "default", on a clean load)."""
    return {name for module in model.modules() if hasattr(getattr(module, "lora_A", None), "keys")
            for name in module.lora_A.keys()}


@pytest.fixture(scope="module")
def adapters(tmp_path_factory, finished_run):
    """Two adapters of the demo: A the session's finished run (20 steps; only read here), B 3 steps with another seed
    (other weights)."""
    b = run_training(demo_config(output_dir=str(tmp_path_factory.mktemp("runs")), run_name="b", max_steps=3, seed=7))
    assert b.status == "completed", b.message
    return finished_run.result.adapter_dir, b.adapter_dir


@pytest.fixture
def comparer():
    c = Comparer()
    yield c
    c.unload()


def lora_modules(model) -> list:
    return [m for m in model.modules() if hasattr(m, "lora_A") and len(getattr(m, "lora_A"))]


def test_format_prompt_is_the_training_prompt(demo_tokenizer):
    """The demo has no chat template: the default template, exactly as the training rows were formatted."""
    cfg = demo_config()
    sft, _ = rendered_rows(cfg, demo_tokenizer)
    raw = load_raw(cfg.dataset, cfg.dataset_split)
    assert format_prompt(demo_tokenizer, raw[0]["instruction"]) == sft[0]["prompt"]
    assert format_prompt(demo_tokenizer, "hello") == "### Instruction:\nhello\n\n### Response:\n"
    with pytest.raises(InferError, match="empty"):
        format_prompt(demo_tokenizer, "   ")


def test_format_prompt_uses_the_chat_template(demo_tokenizer):
    import copy

    tok = copy.deepcopy(demo_tokenizer)
    tok.chat_template = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
                         "{% if add_generation_prompt %}<|assistant|>{% endif %}")
    assert format_prompt(tok, "hello") == "<|user|>hello\n<|assistant|>"


def test_generate_stream_grows_and_greedy_is_reproducible(adapters, comparer):
    loaded = comparer.load(adapters[0])
    prompt = format_prompt(loaded.tokenizer, PROMPT)
    chunks = list(generate_stream(loaded.model, loaded.tokenizer, prompt, max_new_tokens=12))
    assert chunks and all(later.startswith(earlier) for earlier, later in zip(chunks, chunks[1:]))
    again = list(generate_stream(loaded.model, loaded.tokenizer, prompt, max_new_tokens=12))
    assert again[-1] == chunks[-1]
    sampled = [list(generate_stream(loaded.model, loaded.tokenizer, prompt, max_new_tokens=12, temperature=1.0,
                                    top_p=0.95, seed=s))[-1:] for s in (1, 1)]
    assert sampled[0] == sampled[1]  # same seed, same sample


def test_closing_the_stream_stops_generation(adapters, comparer):
    loaded = comparer.load(adapters[0])
    with loaded.model.disable_adapter():  # the random base talks for a long time
        stream = generate_stream(loaded.model, loaded.tokenizer, "### Instruction:\n", max_new_tokens=400)
        first = next(stream)
        stream.close()  # returns only after the generation thread has ended
    assert first


def test_trained_adapter_answers_differently_from_the_base(adapters, comparer):
    steps = list(comparer.compare(adapters[0], PROMPT, max_new_tokens=8))
    base, tuned = steps[-1]
    assert base and tuned and base != tuned
    assert all(t == "" for _, t in steps[: len(steps) // 2 or 1])  # the base streams first, then the adapter
    assert comparer.answer(adapters[0], PROMPT, max_new_tokens=8) == (base, tuned)  # greedy: reproducible


def test_base_answer_is_the_plain_base_model(adapters, comparer):
    """disable_adapter gives exactly the base model's logits (same quantized weights, no LoRA)."""
    from core.model import load as model_lib
    from peft import prepare_model_for_kbit_training

    loaded = comparer.load(adapters[0])
    ids = loaded.tokenizer(format_prompt(loaded.tokenizer, PROMPT), return_tensors="pt")["input_ids"]
    with torch.no_grad(), loaded.model.disable_adapter():
        via_peft = loaded.model(input_ids=ids).logits
    with torch.no_grad():
        tuned = loaded.model(input_ids=ids).logits
    cfg = loaded.config
    base = model_lib.load_model(cfg)
    if cfg.load_in_4bit and cfg.upcast_to_fp32:
        base = prepare_model_for_kbit_training(base, use_gradient_checkpointing=False)
    with torch.no_grad():
        plain = base.eval()(input_ids=ids).logits
    torch.testing.assert_close(via_peft, plain)
    assert not torch.allclose(tuned, plain, atol=1e-3)


def test_same_adapter_is_cached_and_switching_never_stacks_lora(adapters, comparer):
    a_dir, b_dir = adapters
    model_a = comparer.load(a_dir).model
    n_lora = len(lora_modules(model_a))
    cfg = adapter_config(a_dir)
    assert n_lora == 2 * len(cfg.lora_target_modules)  # 2 decoder layers x 4 target modules
    assert comparer.load(a_dir).model is model_a  # same adapter: no reload
    gone = weakref.ref(model_a)
    del model_a

    model_b = comparer.load(b_dir).model
    gc.collect()
    assert gone() is None  # A's model was released, not kept next to B's
    assert list(model_b.peft_config) == ["default"]
    assert lora_adapter_names(model_b) == {"default"}
    assert len(lora_modules(model_b)) == n_lora  # one set of LoRA layers, not two
    saved = load_file(f"{b_dir}/adapter_model.safetensors")
    state = {k: v for k, v in model_b.state_dict().items() if "lora_" in k}
    assert len(state) == len(saved)
    for key, value in saved.items():  # the live LoRA weights are B's
        live = next(v for k, v in state.items() if k.replace(".default", "").endswith(key.split("base_model.")[-1]))
        torch.testing.assert_close(live.float(), value.float())


def test_not_an_adapter_folder_is_a_clear_error(tmp_path, comparer):
    with pytest.raises(InferError, match="adapter_config.json"):
        comparer.load(tmp_path)
    (tmp_path / "adapter_config.json").write_text("{}")  # no rank: damaged, said before any library reads it
    with pytest.raises(InferError, match="adapter_config.json does not hold a LoRA rank"):
        list(comparer.compare(tmp_path, PROMPT))


def test_stop_ends_a_comparison_early(adapters, comparer):
    """What a Stop does: Comparer.stop() from another thread ends the answer at its next token."""
    stream = comparer.compare(adapters[0], PROMPT, max_new_tokens=400, temperature=1.0, seed=3)
    next(stream)
    comparer.stop()
    rest = list(stream)
    base, tuned = rest[-1] if rest else ("", "")
    assert tuned == ""  # stopped before the adapter's turn
    assert len(base) < 2000
    assert comparer.answer(adapters[0], PROMPT, max_new_tokens=8)[1]  # the next comparison runs normally
