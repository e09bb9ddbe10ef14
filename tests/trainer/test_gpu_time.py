"""gpu_time: the compute / communication / idle split of a profiled window, from a Chrome trace."""

from sparsebert.trainer.profiling import gpu_time


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
