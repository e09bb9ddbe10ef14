"""SM clock and power of the node's GPUs while a benchmark run lasts (NVML), for the benches' JSON: a busy GPU
below its top clock (power or thermal limit) is a limit of the card, not of the host-side step."""

from __future__ import annotations

import statistics
import threading
import time


class ClockSampler:
    """SM clock and power of every GPU of the node (NVML order, whatever CUDA_VISIBLE_DEVICES says), sampled
    every ``interval`` s while a run lasts, summarized over the run's timed steps (the scaling bench samples on
    rank 0 only: N busy GPUs against one). Records nothing where NVML is missing or a query fails.

    The SM clock is read as it is at the sample; the power is what NVML reports, which on Ampere and newer
    (except A100) is an average over the last second, so over a window shorter than a few seconds only the
    clock means anything."""

    def __init__(self, interval: float = 0.2):
        self.interval = interval  # seconds between samples; each reads every GPU's clock and power (~1 ms)
        self.samples: list[tuple[float, list[tuple[int, float]]]] = []  # (perf_counter, per GPU)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            import pynvml

            pynvml.nvmlInit()
        except Exception:
            return
        try:
            handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
            while not self._stop.wait(self.interval):
                self.samples.append((time.perf_counter(),
                                     [(pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM),
                                       pynvml.nvmlDeviceGetPowerUsage(h) / 1000) for h in handles]))
        except pynvml.NVMLError:
            self.samples.clear()  # a card that cannot report: no partial record
        finally:
            pynvml.nvmlShutdown()

    def __enter__(self) -> ClockSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def summary(self, window: tuple[float, float]) -> dict:
        """Per GPU of the node: median SM clock (MHz) and median power (W) over the timed steps (``window``: their
        perf_counter ends); set-up, compilation and warm-up would mix idle clocks in."""
        timed = [values for at, values in self.samples if window[0] <= at <= window[1]]
        if not timed:
            return {}
        gpus = range(len(timed[0]))
        return {"sm_clock_mhz": [round(statistics.median(s[g][0] for s in timed)) for g in gpus],
                "power_w": [round(statistics.median(s[g][1] for s in timed)) for g in gpus]}
