"""What ``torch.profiler`` is asked to record: schedule, activities and flags.

Kept apart from the session so that the benchmark can build a bare ``torch.profiler.profile``
with exactly the same schedule and flags as ``stepscope.profile`` (point of comparison (b)).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch.profiler import ProfilerAction, ProfilerActivity

from stepscope.errors import UsageError

RECORDING = frozenset({ProfilerAction.RECORD, ProfilerAction.RECORD_AND_SAVE})
PROFILING = frozenset({ProfilerAction.WARMUP}) | RECORDING
"""Actions during which the profiler runs (warming up or recording)."""


@dataclass(frozen=True)
class Schedule:
    """``torch.profiler.schedule`` arguments, with ``repeat`` bounded.

    torch's schedule repeats forever when ``repeat=0``; a week-long job would then write a trace
    every ``wait + warmup + active`` steps until the disk fills, so ``repeat`` must be >= 1 here.
    """

    wait: int = 5
    warmup: int = 2
    active: int = 3
    repeat: int = 1
    skip_first: int = 0

    def __post_init__(self) -> None:
        if self.wait < 0 or self.warmup < 0 or self.skip_first < 0:
            raise UsageError("wait, warmup and skip_first must be >= 0")
        if self.active < 1:
            raise UsageError("active must be >= 1 (the number of steps recorded per trace)")
        if self.repeat < 1:
            raise UsageError("repeat must be >= 1: an unbounded schedule writes traces forever")

    def torch_schedule(self) -> Callable[[int], ProfilerAction]:
        return torch.profiler.schedule(wait=self.wait, warmup=self.warmup, active=self.active,
                                       repeat=self.repeat, skip_first=self.skip_first)

    @property
    def last_step(self) -> int:
        """The last step the schedule records; profiling does nothing after it."""
        return self.skip_first + self.repeat * (self.wait + self.warmup + self.active) - 1


@dataclass(frozen=True)
class Recording:
    """What each profiled step records. Stacks are opt-in: they make traces several times larger."""

    record_shapes: bool = True
    profile_memory: bool = True
    with_stack: bool = False
    with_flops: bool = False
    with_modules: bool = False


def activities() -> list[ProfilerActivity]:
    """CPU always; CUDA when this process can see a GPU."""
    found = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        found.append(ProfilerActivity.CUDA)
    return found


def profiler_kwargs(schedule: Schedule, recording: Recording,
                    actions: Callable[[int], ProfilerAction] | None = None) -> dict[str, Any]:
    """Keyword arguments for ``torch.profiler.profile`` (all but ``on_trace_ready``).

    ``actions`` replaces ``schedule``'s own step -> action function (the watch's, which adds
    capture windows to it).

    ``with_stack`` alone records no Python stacks in current torch; the verbose experimental
    config is what makes them appear, so it is set whenever stacks are asked for.
    """
    kwargs: dict[str, Any] = {
        "activities": activities(),
        "schedule": schedule.torch_schedule() if actions is None else actions,
        "record_shapes": recording.record_shapes,
        "profile_memory": recording.profile_memory,
        "with_stack": recording.with_stack,
        "with_flops": recording.with_flops,
        "with_modules": recording.with_modules,
    }
    if recording.with_stack:
        kwargs["experimental_config"] = torch._C._profiler._ExperimentalConfig(verbose=True)
    return kwargs
