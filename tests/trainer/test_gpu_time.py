"""gpu_time: the compute / communication / idle split of a profiled window, from a Chrome trace."""

from sparsebert.trainer.profiling import gpu_time, kernel_breakdown


def kernel(name: str, start_us: float, dur_us: float) -> dict:
    return {"cat": "kernel", "name": name, "ts": start_us, "dur": dur_us}


def test_split_of_compute_communication_and_idle():
    trace = {"traceEvents": [
        kernel("ampere_bf16_gemm", 0, 4000),          # compute 0-4 ms
        kernel("vectorized_elementwise", 3000, 2000),  # compute 3-5 ms, overlaps the first
        kernel("ncclDevKernel_AllReduce", 4500, 2500),  # comm 4.5-7 ms: 0.5 ms under compute, 2 ms exposed
        kernel("ampere_bf16_gemm", 8000, 1500),         # compute 8-9.5 ms after 1 ms idle
        {"cat": "gpu_memcpy", "name": "Memcpy DtoD", "ts": 9500, "dur": 500},  # a copy is GPU work too
        {"cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 99999},  # host events do not count
    ]}
    assert gpu_time(trace) == {"window_ms": 10.0, "compute_ms": 7.0, "comm_ms": 2.5, "comm_overlapped_ms": 0.5,
                               "comm_exposed_ms": 2.0, "idle_ms": 1.0}


def test_no_kernels_gives_nothing():
    assert gpu_time({"traceEvents": [{"cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 5}]}) == {}


def test_kernel_breakdown_sums_time_per_kind_and_ranks_kernels():
    trace = {"traceEvents": [
        kernel("sm90_xmma_gemm_bf16bf16_bf16f32", 0, 3000),
        kernel("sm90_xmma_gemm_bf16bf16_bf16f32", 3000, 3000),
        kernel("cudnn_generated_fort_native_sdpa_sm90_flash_fprop", 6000, 800),  # attention, not a matmul
        kernel("void cudnn::fusion::compute_dot_do_o_specialized<true, 64>", 6800, 200),  # attention's backward
        kernel("triton_per_fused_add_native_layer_norm_3", 7000, 500),
        kernel("triton_poi_fused_gelu_5", 7500, 250),
        kernel("void at::native::(anonymous)::multi_tensor_apply_kernel<FusedAdamMathFunctor>", 7750, 200),
        kernel("void at::native::multi_tensor_apply_kernel<BinaryOpListAlphaFunctor<float>>", 7950, 50),
        kernel("ncclDevKernel_AllReduce_Sum_bf16", 8000, 1000),
        {"cat": "gpu_memcpy", "name": "Memcpy HtoD (Pinned -> Device)", "ts": 9000, "dur": 100},
        {"cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 99999},  # host events do not count
        kernel("void at::native::vectorized_elementwise_kernel", 9100, 100),
    ]}
    breakdown = kernel_breakdown(trace, top=2)
    assert breakdown["kernel_ms"] == 9.2
    by_kind = breakdown["by_kind"]
    assert list(by_kind)[0] == "matmul"  # the largest first
    assert by_kind["matmul"] == {"ms": 6.0, "count": 2, "share": round(6 / 9.2, 4)}
    assert {kind: e["ms"] for kind, e in by_kind.items()} == {
        "matmul": 6.0, "attention": 1.0, "communication": 1.0,
        "generated reduction (LayerNorm, softmax, loss)": 0.5, "generated pointwise (GELU, dropout, casts, adds)": 0.25,
        "optimizer": 0.2, "foreach (gradient norms and scaling)": 0.05, "copy / memset": 0.1, "other": 0.1}
    assert [(k["name"][:9], k["count"], k["ms"]) for k in breakdown["top_kernels"]] == [
        ("sm90_xmma", 2, 6.0), ("ncclDevKe", 1, 1.0)]
