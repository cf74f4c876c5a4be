"""offload_activations: TRL's own activation offloading (saved-tensor hooks around each training step), CUDA only.

TRL's offloading needs an accelerator device (it copies on a side stream into pinned memory), so on the CPU only its
mapping and its estimator term run here; bench/RESULTS.md has it measured on a GPU.
"""

from trl import SFTConfig

from core.config.arguments import installed_names, sft_kwargs
from core.config.presets import apply_preset
from core.config.settings import TrainConfig
from core.estimate.predict import estimate
from core.estimate.terms import OFFLOAD_STASH
from core.model.shapes import SHAPES

L8B = SHAPES["meta-llama/Llama-3.1-8B"]


def test_the_lever_reaches_trl_on_a_gpu_and_is_off_without_one(tmp_path):
    on = TrainConfig(offload_activations=True)
    assert installed_names(sft_kwargs(on, tmp_path, cuda=True), SFTConfig)["activation_offloading"] is True
    # TRL's offloading asks torch for the accelerator device: without a GPU the run trains as it would without it
    assert installed_names(sft_kwargs(on, tmp_path, cuda=False), SFTConfig)["activation_offloading"] is False
    assert installed_names(sft_kwargs(TrainConfig(), tmp_path, cuda=True), SFTConfig)["activation_offloading"] is False
    SFTConfig(**installed_names(sft_kwargs(on, tmp_path, cuda=False), SFTConfig))  # a config TRL accepts


def test_with_checkpointing_all_but_the_stash_of_layer_inputs_leave_the_gpu():
    low = apply_preset(TrainConfig(model="meta-llama/Llama-3.1-8B"), "six_gb")
    on = estimate(low.replace(offload_activations=True), L8B)
    off = estimate(low.replace(offload_activations=False), L8B)
    tokens = low.per_device_train_batch_size * low.max_length
    layer_input = 2 * L8B.hidden_size * tokens  # one bf16 hidden state per token
    assert off.activations - on.activations == (L8B.num_hidden_layers - OFFLOAD_STASH) * layer_input
    assert on.nvml_peak < off.nvml_peak
    assert any("offload_activations" in n for n in on.notes)


def test_without_checkpointing_about_one_layer_stays_on_the_gpu():
    fast = apply_preset(TrainConfig(model="meta-llama/Llama-3.1-8B"), "fastest").replace(gradient_checkpointing=False)
    on, off = estimate(fast.replace(offload_activations=True), L8B), estimate(fast, L8B)
    assert 0 < on.activations <= off.activations / L8B.num_hidden_layers
