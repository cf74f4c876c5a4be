"""The chapter's memory checklist maps both ways onto the configuration."""

import pytest

from core.config import checklist
from core.checks import validate
from core.config.settings import TrainConfig, demo_config, Hardware

HW = Hardware(cuda=True, bf16=True, bitsandbytes=True)


def test_seven_items_in_the_chapters_order():
    assert [i.key for i in checklist.ITEMS] == [
        "qlora", "gradient_checkpointing", "gradient_accumulation", "efficient_optimizer", "bf16",
        "short_max_length", "small_batches"]
    assert all(len(i.tradeoff) > 40 and i.fields for i in checklist.ITEMS)


def test_the_chapter_recipe_has_every_item_on():
    assert all(checklist.active(TrainConfig()).values())


@pytest.mark.parametrize("key", [i.key for i in checklist.ITEMS])
def test_toggle_off_and_on_round_trips(key):
    base = TrainConfig()
    off = checklist.toggle(base, key, False)
    assert checklist.active(off)[key] is False
    assert validate(off, HW) == []
    on = checklist.toggle(off, key, True)
    assert checklist.active(on)[key] is True
    assert on == base  # ticking back restores the chapter's settings


def test_batch_items_keep_the_effective_batch():
    c = checklist.toggle(TrainConfig(), "small_batches", False)
    assert c.per_device_train_batch_size == 8 and c.effective_batch_size == 16
    c = checklist.toggle(TrainConfig(), "gradient_accumulation", False)
    assert (c.per_device_train_batch_size, c.gradient_accumulation_steps) == (16, 1)


def test_missing_lists_what_is_off():
    c = demo_config()  # the demo turns checkpointing and the 8-bit optimizer off, and uses batch 8
    assert {i.key for i in checklist.missing(c)} == {"gradient_checkpointing", "gradient_accumulation",
                                                    "efficient_optimizer", "small_batches"}
