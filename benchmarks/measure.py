"""Steady-state timing and peak memory, shared by every benchmark row.

A row's first steps trace and compile and warm caches; `SteadyStateWindows`
ignores them, then times consecutive windows of at least `window_seconds`,
each a whole number of steps, and reports the median window's rate.
"""

import resource
import statistics
import time


class SteadyStateWindows:
    """Call `step_done()` after every step; it returns True once all windows are timed.

    Args:
        units_per_step: what one step produces (tokens, sentences).
        windows: how many windows to time.
        window_seconds: the least duration of a window.
        warmup_steps, warmup_seconds: steps excluded from timing, at least
            this many and for at least this long.
    """

    def __init__(self, units_per_step, windows=3, window_seconds=10.0, warmup_steps=3, warmup_seconds=3.0):
        self.units_per_step = units_per_step
        self.windows = windows
        self.window_seconds = window_seconds
        self.warmup_steps = warmup_steps
        self.warmup_seconds = warmup_seconds
        self.rates = []
        self.window_steps = []
        self._steps = 0
        self._first_step_end = None
        self._window_start = None
        self._steps_in_window = 0

    def step_done(self):
        now = time.perf_counter()
        self._steps += 1
        if self._first_step_end is None:
            self._first_step_end = now
        if self._window_start is None:
            warm = self._steps >= self.warmup_steps and now - self._first_step_end >= self.warmup_seconds
            if warm:
                self._window_start = now
            return False
        self._steps_in_window += 1
        elapsed = now - self._window_start
        if elapsed >= self.window_seconds:
            self.rates.append(self._steps_in_window * self.units_per_step / elapsed)
            self.window_steps.append(self._steps_in_window)
            self._window_start, self._steps_in_window = now, 0
        return len(self.rates) >= self.windows

    @property
    def done(self):
        return len(self.rates) >= self.windows

    def result(self):
        return {
            "rate": statistics.median(self.rates),
            "window_rates": self.rates,
            "window_steps": self.window_steps,
        }


def peak_memory_mib():
    """This process's peak resident set size so far, in MiB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
