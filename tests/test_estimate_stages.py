"""The LM head + loss of a preference stage in the estimate (issue 44).

TRL's ORPOTrainer keeps the whole [2B, T, V] logits of the pair batch (fp32: accelerate converts the model's
outputs), a cross-entropy on the chosen half and a log-softmax over all of it, liger or not; DPO and KTO go through
TRL's chunked LM head as SFT does. Run 19 (H200, Llama-3.1-8B lowest_memory, 4 pairs x 512): ORPO allocated 10.42
GiB, estimated 5.35 with SFT's term (-48.7%), 10.69 with the measured one (+2.5%).
"""

from __future__ import annotations

import pytest
import torch

from core.config.settings import TrainConfig
from core.estimate import measure, preference
from core.estimate.predict import estimate
from core.model.shapes import get_shape


@pytest.fixture()
def own_cache(tmp_path, monkeypatch):
    """A fresh measurement: no disk or in-process cache from an earlier run."""
    monkeypatch.setenv("MEMTUNE_CACHE", str(tmp_path))
    monkeypatch.setattr(measure, "_DISK", None)
    monkeypatch.setattr(measure, "_MEMO", {})


def _saved_per_logit(vocabs=(128, 256), tokens=16) -> float:
    """Bytes autograd keeps at the end of TRL's ORPO forward per (row token x vocab) element, counted with
    saved_tensors_hooks (distinct storages, parameters excluded): a floor under the forward + backward peak, counted
    independently of core.estimate.preference's storage tracker. Two vocabularies: what does not grow with it
    cancels."""
    kept = []
    for vocab in vocabs:
        storages: dict[int, int] = {}

        def pack(t):
            if not isinstance(t, torch.nn.Parameter):
                s = t.untyped_storage()
                storages[s.data_ptr()] = s.nbytes()
            return t

        preference.orpo_step(vocab, "bfloat16", tokens=tokens,
                             counting=lambda: torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t))
        kept.append(sum(storages.values()))
    return (kept[1] - kept[0]) / (2 * tokens * (vocabs[1] - vocabs[0]))


def _cfg(stage: str, **kw) -> TrainConfig:
    return TrainConfig(stage=stage, use_liger_kernel=True, per_device_train_batch_size=4, max_length=512, **kw)


def test_orpo_logits_term_holds_what_trls_orpo_loss_keeps(own_cache):
    saved = _saved_per_logit()
    assert saved >= 5.5  # the fp32 logits (accelerate converts the outputs) + the chosen half's log-softmax, ~4 + ~2
    measured = preference.orpo_bytes_per_logit("bfloat16")
    assert saved <= measured <= 4 * saved  # the backward's gradients come on top of what the forward kept
    vocab = get_shape("meta-llama/Llama-3.1-8B").vocab_size
    orpo, dpo = estimate(_cfg("orpo")), estimate(_cfg("dpo"))
    assert orpo.tokens == dpo.tokens == 4096
    assert orpo.logits >= saved * orpo.tokens * vocab  # SFT's chunked-head term (0.44 GiB here) did not
    assert orpo.peak_allocated - dpo.peak_allocated >= (saved - 1) * orpo.tokens * vocab
    assert any("whole logits" in n for n in orpo.notes) and not any("whole logits" in n for n in dpo.notes)


def test_dpo_and_kto_keep_sfts_chunked_head(own_cache):
    """TRL's DPO and KTO trainers compute log-probs through its chunked LM head (add_fused_lm_head): their terms
    are SFT's at their sequences per row, untouched by the ORPO term."""
    dpo, kto = estimate(_cfg("dpo")), estimate(_cfg("kto"))
    sft8 = estimate(TrainConfig(use_liger_kernel=True, per_device_train_batch_size=8, max_length=512))
    sft4 = estimate(TrainConfig(use_liger_kernel=True, per_device_train_batch_size=4, max_length=512))
    assert (dpo.logits, dpo.temporaries, dpo.peak_allocated) == (sft8.logits, sft8.temporaries, sft8.peak_allocated)
    assert (kto.logits, kto.temporaries, kto.peak_allocated) == (sft4.logits, sft4.temporaries, sft4.peak_allocated)
