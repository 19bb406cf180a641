"""Steady-state timing and peak memory, shared by every benchmark row.

A row's first steps trace and compile and warm caches; `SteadyStateWindows`
ignores them, then times consecutive windows of at least `window_seconds`,
each a whole number of steps, and reports the median window's rate.

`ConductedWindows` times the same windows one at a time, when the suite says
so: the suite keeps several rows alive and has each time one window in turn,
round after round, so that a row never gets all of a fast or a slow stretch
of this shared machine to itself.

`alternating_rounds` does the same for contenders in one process (a run and
its export, float32 and bfloat16): one pass each a round, in turn.
"""

import json
import resource
import statistics
import sys
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


class ConductedWindows(SteadyStateWindows):
    """`SteadyStateWindows` whose windows start when the conductor says so.

    After warm-up the row prints `BENCH {"ready": true}` and waits for a line on
    stdin: `window` times one window from that moment and prints
    `BENCH {"window_rate": ...}`; `finish` ends the row. The row is blocked in
    `step_done()` while it waits, so it takes no CPU from the row being timed.

    A window starts right away, with no untimed step first: the first training
    step after a row has waited through another row's window (0.76 s) was
    measured as fast as the median step (0.75 s), so a wait leaves nothing
    cold that a window would pay for.
    """

    def __init__(self, units_per_step, window_seconds=10.0, commands=None, reports=None, warmup_steps=2, warmup_seconds=0.0):
        # Two steps of warm-up: the first traces, the second runs the traced graph once.
        super().__init__(
            units_per_step, windows=0, window_seconds=window_seconds, warmup_steps=warmup_steps, warmup_seconds=warmup_seconds
        )
        self.commands = commands or sys.stdin
        self.reports = reports or sys.stdout
        self._finished = False

    def _report(self, message):
        self.reports.write("BENCH " + json.dumps(message) + "\n")
        self.reports.flush()

    def _wait_for_command(self):
        command = self.commands.readline().strip()
        if command == "window":
            self._window_start, self._steps_in_window = time.perf_counter(), 0
        elif command in ("finish", ""):  # "" : the conductor is gone
            self._finished = True
        else:
            raise ValueError(f"unknown benchmark command {command!r}")

    def step_done(self):
        if self._finished:
            return True
        now = time.perf_counter()
        self._steps += 1
        if self._first_step_end is None:
            self._first_step_end = now
        if self._window_start is None:
            warm = self._steps >= self.warmup_steps and now - self._first_step_end >= self.warmup_seconds
            if warm:
                self._report({"ready": True})
                self._wait_for_command()
            return self._finished
        self._steps_in_window += 1
        elapsed = now - self._window_start
        if elapsed >= self.window_seconds:
            rate = self._steps_in_window * self.units_per_step / elapsed
            self.rates.append(rate)
            self.window_steps.append(self._steps_in_window)
            self._report({"window_rate": rate})
            self._window_start = None
            self._wait_for_command()
        return self._finished

    @property
    def done(self):
        return self._finished


def peak_memory_mib():
    """This process's peak resident set size so far, in MiB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def alternating_rounds(contenders, rounds):
    """Time each contender's whole job once a round, every other round in reverse order.

    Neither contender always runs first (on a machine that has just warmed
    up, or slowed down). Call each once before, untimed: tracing and loading
    are not throughput.

    Args:
        contenders: `{name: job}`, each `job()` returning its output.
        rounds: how many rounds.

    Returns:
        `({name: [seconds of each round]}, {name: the last round's output})`.
    """
    names = list(contenders)
    seconds, outputs = {name: [] for name in names}, {}
    for round_index in range(rounds):
        for name in names if round_index % 2 == 0 else names[::-1]:
            started = time.perf_counter()
            outputs[name] = contenders[name]()
            seconds[name].append(time.perf_counter() - started)
    return seconds, outputs
