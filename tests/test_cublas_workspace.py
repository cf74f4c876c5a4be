"""small_cublas_workspace: the environment torch sizes cuBLAS' and cuBLASLt's workspaces by, set before the first
matrix product of a CUDA run (core.model.load.configure_cuda); its memory is measured in bench/RESULTS.md run 11."""

from core.config.presets import apply_preset
from core.config.settings import TrainConfig
from core.estimate.predict import estimate
from core.estimate.terms import CUBLAS_WORKSPACE, SMALL_CUBLAS_WORKSPACE
from core.model.load import SMALL_CUBLAS_WORKSPACE as ENV, cublas_env
from core.model.shapes import SHAPES


def test_the_lever_names_the_variables_torch_reads_and_nothing_when_off():
    assert cublas_env(TrainConfig()) == {}
    assert cublas_env(TrainConfig(small_cublas_workspace=True)) == {"CUBLAS_WORKSPACE_CONFIG": ":4096:1",
                                                                    "CUBLASLT_WORKSPACE_SIZE": "1024"}
    # the estimator's term is the same 4 MiB + 1 MiB
    assert SMALL_CUBLAS_WORKSPACE == sum(int(v) for v in (ENV["CUBLAS_WORKSPACE_CONFIG"].split(":")[1],
                                                          ENV["CUBLASLT_WORKSPACE_SIZE"])) * 1024


def test_estimate_counts_the_smaller_workspace():
    six = apply_preset(TrainConfig(model="meta-llama/Llama-2-7b-hf"), "six_gb", None)
    shape = SHAPES["meta-llama/Llama-2-7b-hf"]
    on = estimate(six.replace(small_cublas_workspace=True), shape)
    off = estimate(six.replace(small_cublas_workspace=False), shape)
    assert off.peak_allocated - on.peak_allocated == CUBLAS_WORKSPACE - SMALL_CUBLAS_WORKSPACE
