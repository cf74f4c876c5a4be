"""Host work per micro-batch (core/train/host.py, issue 42): the Trainer's flop count gives the same number with the
model's parameters counted once, for SFT and every preference stage's trainer; the varlen attention reads its
kernel's arguments once per kernel."""

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

from core.model import attention
from core.train import stages
from core.train.host import counted_once


@pytest.fixture()
def tiny_model():
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64)
    return LlamaForCausalLM(config)


def trainers(model, tmp_path):
    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none")
    return Trainer(model=model, args=args), counted_once(Trainer)(model=model, args=args)


def test_the_flop_count_is_the_trainers_with_the_parameters_counted_once(tiny_model, tmp_path, monkeypatch):
    plain, once = trainers(tiny_model, tmp_path)
    calls = []
    count = type(tiny_model).num_parameters
    monkeypatch.setattr(type(tiny_model), "num_parameters",
                        lambda self, **kw: calls.append(kw) or count(self, **kw))
    batches = [{"input_ids": torch.zeros(1, n, dtype=torch.long)} for n in (7, 13, 5)]
    expected = [plain.floating_point_ops(b) for b in batches]
    assert len(calls) == 3 and expected[0] == 6 * 7 * count(tiny_model, exclude_embeddings=True)
    calls.clear()
    assert [once.floating_point_ops(b) for b in batches] == expected
    assert calls == [{"exclude_embeddings": True}]  # once for the three micro-batches
    assert type(once).__name__ == "Trainer" and isinstance(once, Trainer)


def test_a_new_model_object_is_counted_again(tiny_model, tmp_path):
    _, once = trainers(tiny_model, tmp_path)
    batch = {"input_ids": torch.zeros(1, 4, dtype=torch.long)}
    first = once.floating_point_ops(batch)
    bigger = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                          num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64))
    once.model = bigger
    assert once.floating_point_ops(batch) == 6 * 4 * bigger.num_parameters(exclude_embeddings=True) > first


def test_a_batch_without_the_main_input_is_left_to_the_trainer(tiny_model, tmp_path):
    plain, once = trainers(tiny_model, tmp_path)
    batch = {"chosen_input_ids": torch.zeros(1, 4, dtype=torch.long)}
    assert once.floating_point_ops(batch) == plain.floating_point_ops(batch) == 0


@pytest.mark.parametrize("stage", ["dpo", "kto", "orpo"])
def test_every_stage_trainer_keeps_its_class_and_counts_once(stage):
    trainer_class, _ = stages.trainer_classes(stage)
    made = counted_once(trainer_class)
    assert issubclass(made, trainer_class) and made.__name__ == trainer_class.__name__
    assert counted_once(trainer_class) is made  # one class per trainer class, not one per run


def test_the_varlen_kernels_arguments_are_read_once_per_kernel(monkeypatch):
    seen = []

    def kernel(q, k, v, cu_q, cu_k, max_q, max_k, *, scale=None, window_size=(-1, -1), enable_gqa=False):
        seen.append((scale, window_size, enable_gqa))
        return q

    calls = []
    signature = attention.inspect.signature
    monkeypatch.setattr(attention.inspect, "signature", lambda f: calls.append(f) or signature(f))
    monkeypatch.setattr(attention, "_varlen_kernel", lambda: kernel)
    attention._parameters.cache_clear()
    q = torch.zeros(6, 2, 4)
    k = torch.zeros(6, 1, 4)
    cu = torch.tensor([0, 6], dtype=torch.int32)
    for _ in range(3):
        attention._run_varlen(q, k, k, cu, 6, 0.5)
    assert calls == [kernel] and seen == [(0.5, (-1, 0), True)] * 3
