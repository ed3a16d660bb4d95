"""Memory snapshots built in code, in each format torch has written since 2.0, and a plain-Python
reading of any snapshot to check the store's tables against.

``build`` lays a snapshot out as torch does: frame dicts made once and shared by every stack
that holds them (so the pickle memo writes each once), one history list per device, segments
holding their blocks. Formats:

- ``"2.0"``: no ``time_us``, no ``allocator_settings``; blocks without ``address``, their stack
  and requested size in ``history[-1]`` (``frames``, ``real_size``).
- ``"2.1"``: ``time_us``, blocks with ``address``, ``requested_size``, ``frames``.
- ``"2.5"``: as 2.1 plus ``allocator_settings``, ``is_expandable``, ``segment_pool_id``,
  ``compile_context``/``user_metadata`` on entries; with ``expandable=True`` the segments grow by
  ``segment_map``/``segment_unmap`` instead of ``segment_alloc``/``segment_free``.
"""

from __future__ import annotations

from typing import Any

MB = 1 << 20
BASE_TIME_US = 1_773_270_053_000_000

_PY_FRAMES = [
    ("/home/u/train.py", 40, "train_step"),
    ("/home/u/model.py", 12, "forward"),
    ("/usr/lib/python3.11/site-packages/torch/nn/modules/module.py", 1779, "_wrapped_call_impl"),
    ("/home/u/model.py", 30, "attention"),
]
_CPP_FRAMES = [
    ("??", 0, "torch::unwind::unwind()"),
    ("CUDACachingAllocator.cpp", 0, "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc"),
]
_BACKWARD_FRAMES = [
    ("??", 0, "torch::autograd::Engine::evaluate_function(std::shared_ptr<torch::autograd::GraphTask>&)"),
    ("/usr/lib/python3.11/site-packages/torch/_tensor.py", 626, "backward"),
    ("/home/u/train.py", 44, "train_step"),
]


class _Frames:
    """Frame dicts made once each, as torch does."""

    def __init__(self, cpp: bool) -> None:
        self._made: dict[tuple, dict[str, Any]] = {}
        self.cpp = cpp

    def stack(self, *picks: int, backward: bool = False) -> list[dict[str, Any]]:
        chosen = ([*_CPP_FRAMES] if self.cpp else []) + (_BACKWARD_FRAMES if backward else [_PY_FRAMES[i] for i in picks])
        out = []
        for f in chosen:
            if f not in self._made:
                self._made[f] = {"filename": f[0], "line": f[1], "name": f[2]}
            out.append(self._made[f])
        return out


def build(version: str = "2.5", *, devices: int = 1, expandable: bool = False, oom: bool = False,
          cpp: bool = False, repeat: int = 1, oom_request: int = 64 * MB) -> dict[str, Any]:
    """A snapshot whose history, per device, allocates A (8 MB, forward), B (2 MB), G (1 MB, in
    the backward), frees A (in the backward: A is an activation), allocates and frees C (4 MB),
    frees G, ``repeat`` times over, allocates C again, then (``oom``) fails to allocate
    ``oom_request`` bytes with 6 MB free on the device."""
    frames = _Frames(cpp)
    new = version != "2.0"
    segments, traces = [], []
    for device in range(devices):
        seg_addr = (device + 1) << 40
        entries: list[dict[str, Any]] = []
        t = BASE_TIME_US + device * 10

        def event(action: str, addr: int, size: int, stack: list[dict[str, Any]]) -> None:
            nonlocal t
            t += 7
            entry: dict[str, Any] = {"action": action, "addr": addr, "size": size, "stream": 0, "frames": stack}
            if new:
                entry["time_us"] = t
            if version == "2.5":
                entry.update(compile_context="N/A", user_metadata="")
            entries.append(entry)

        grow, shrink = ("segment_map", "segment_unmap") if expandable else ("segment_alloc", "segment_free")
        event(grow, seg_addr, 20 * MB, frames.stack(0, 1))
        a, b, c, g = seg_addr, seg_addr + 8 * MB, seg_addr + 10 * MB, seg_addr + 16 * MB
        for _ in range(repeat):
            event("alloc", a, 8 * MB, frames.stack(2, 3, 1, 0))
            event("alloc", b, 2 * MB, frames.stack(0, 1))
            event("alloc", g, 1 * MB, frames.stack(backward=True))
            event("free_requested", a, 8 * MB, frames.stack(backward=True))  # freed by the autograd engine
            event("free_completed", a, 8 * MB, frames.stack(backward=True))
            event("alloc", c, 4 * MB, frames.stack(2, 1, 0))
            event("free_requested", c, 4 * MB, [])
            event("free_completed", c, 4 * MB, [])
            event("free_requested", g, 1 * MB, [])
            event("free_completed", g, 1 * MB, [])
        event("alloc", c, 4 * MB, frames.stack(2, 1, 0))
        if oom:
            event("oom", 6 * MB, oom_request, frames.stack(0, 1, 2, 3))  # addr: the device's free bytes
        if expandable:
            event(shrink, seg_addr + 16 * MB, 4 * MB, [])
        traces.append(entries)
        blocks = [
            {"size": 8 * MB, "state": "inactive", "addr": a, "stack": []},
            {"size": 2 * MB, "state": "active_allocated", "addr": b, "stack": frames.stack(0, 1), "req": 2 * MB - 512},
            {"size": 4 * MB, "state": "active_allocated", "addr": c, "stack": frames.stack(2, 1, 0), "req": 4 * MB},
            {"size": (2 if expandable else 6) * MB, "state": "inactive", "addr": c + 4 * MB, "stack": []},
        ]
        seg: dict[str, Any] = {"device": device, "address": seg_addr, "total_size": (16 if expandable else 20) * MB,
                               "allocated_size": 6 * MB, "active_size": 6 * MB, "stream": 0,
                               "segment_type": "large", "blocks": []}
        if new:
            seg.update(requested_size=6 * MB - 512, frames=[])
        if version == "2.5":
            seg.update(segment_pool_id=(0, 0), is_expandable=expandable)
        for blk in blocks:
            if new:
                seg["blocks"].append({"address": blk["addr"], "size": blk["size"], "requested_size": blk.get("req", 0),
                                      "state": blk["state"], "frames": blk["stack"]})
            else:
                history = [{"addr": blk["addr"], "real_size": blk["req"], "frames": blk["stack"]}] if "req" in blk else []
                seg["blocks"].append({"size": blk["size"], "state": blk["state"], "history": history})
        segments.append(seg)
    snapshot: dict[str, Any] = {"segments": segments, "device_traces": traces}
    if version == "2.5":
        snapshot["allocator_settings"] = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True" if expandable else "",
                                          "expandable_segments": expandable, "max_split_size": -1}
        snapshot["external_annotations"] = []
    return snapshot


def _frames(frames: Any) -> tuple | None:
    return tuple((f["filename"], f["line"], f["name"]) for f in frames) if frames else None


def expected_events(snapshot: dict[str, Any]) -> list[tuple]:
    """``(device, seq, action, address, size, stream, ts_ns, frames)`` of each history entry."""
    return [(device, seq, e["action"], e.get("addr"), e.get("size"), e.get("stream"),
             None if e.get("time_us") is None else e["time_us"] * 1000, _frames(e.get("frames")))
            for device, entries in enumerate(snapshot.get("device_traces") or [])
            for seq, e in enumerate(entries)]


def expected_blocks(snapshot: dict[str, Any]) -> list[tuple]:
    """``(device, segment_address, address, size, requested_size, state, frames)`` of each block."""
    rows = []
    for seg in snapshot["segments"]:
        address = seg["address"]
        for b in seg["blocks"]:
            last = b["history"][-1] if b.get("history") else {}
            rows.append((seg.get("device"), seg["address"], b.get("address", address), b["size"],
                         b.get("requested_size", last.get("real_size")), b["state"],
                         _frames(b["frames"] if "frames" in b else last.get("frames"))))
            address = b.get("address", address) + b["size"]
    return rows


def expected_segments(snapshot: dict[str, Any]) -> list[tuple]:
    """``(device, address, total_size, allocated_size, stream, segment_type, is_expandable)``."""
    return [(s.get("device"), s["address"], s["total_size"], s.get("allocated_size"), s.get("stream"),
             s.get("segment_type"), s.get("is_expandable")) for s in snapshot["segments"]]
