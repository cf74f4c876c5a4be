"""bench/profsum.py: the summary kept from a torch.profiler trace of steady steps (bench/RESULTS.md, run 7)."""


def test_profile_summary_of_a_trace_counts_kernels_syncs_and_the_gaps_between_matrix_products():
    """bench/profsum.py on a hand-made trace: two GEMMs with one small kernel and idle time between them."""
    from bench.profsum import summarize_trace

    def k(name, ts, dur, cat="kernel"):
        return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur}

    trace = {"traceEvents": [
        k("nvjet_tst_128x256_64x4", 0, 100), k("elementwise_kernel", 120, 10), k("sm90_xmma_gemm_bf16", 200, 100),
        k("kDequantizeBlockwise_nf4", 300, 50), k("cudaDeviceSynchronize", 0, 30, "cuda_runtime"),
        k("cudaLaunchKernel", 0, 5, "cuda_runtime"), k("aten::mm", 0, 400, "cpu_op"),
    ]}
    out = summarize_trace(trace, steps=1, wall_s=0.001)
    assert out["kernels_per_step"] == 4 and out["cuda_launches_per_step"] == 1
    assert out["kernel_ms_per_step"]["matmul"] == {"count": 2, "ms": 0.2}
    assert out["kernel_ms_per_step"]["bitsandbytes"]["count"] == 1
    assert out["gpu_busy_pct"] == 26.0  # 260 us of kernels in a 1,000 us window
    assert out["host_syncs_per_step"] == {"cudaDeviceSynchronize": 1.0}
    gaps = out["matmul_gaps"]
    assert gaps["count_per_step"] == 1 and gaps["median_us"] == 100.0 and gaps["median_kernels_between"] == 1
    assert gaps["idle_ms_per_step"] == 0.09  # 100 us between the GEMMs, 10 of them in the elementwise kernel
