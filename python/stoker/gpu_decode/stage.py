"""The device stage of decode="gpu": each batch's handed-over JPEGs decoded on the device in one
batched call, each only the region its plan asks for, then rendered into the batch by
resample.render, all on the feed's side stream before augment= and normalising."""

from __future__ import annotations

import time
from collections import deque
from typing import Any, NamedTuple

import numpy as np
import torch

from . import resample
from .backends import DeviceDecoder

# A group of images is decoded into one padded buffer and rendered together; this bounds its
# size (the resampler's int32 sums take about twice as much again).
GROUP_BYTES = 64 << 20


class _Queued(NamedTuple):
    blobs: list[bytes]
    plans: np.ndarray  # float64 [k, 19], of the rows handed over
    on_device: np.ndarray  # int64 [k]: the rows handed over
    samples: np.ndarray  # int64 [B]: each row's sample (pack order)
    epoch: int


class DeviceDecodeStage:
    """Decodes the rows of each batch that the workers handed over (their files' bytes and
    plans, queued by the loader as it hands the batch to the feed) into the batch's images on
    the device. Batches are queued and decoded in the same order."""

    def __init__(self, decoder: DeviceDecoder, *, height: int, width: int, channels: int = 3,
                 fill: int = 0, group_bytes: int = GROUP_BYTES):  # fmt: skip
        self.decoder = decoder
        self.height, self.width, self.channels, self.fill = height, width, channels, fill
        self.group_bytes = group_bytes
        self.pending: deque[_Queued] = deque()
        self.device_decoded = 0  # images decoded on the device
        self.host_decoded = 0  # decoded by the workers (the file, or decode="auto"'s split)
        self.device_failed = 0  # handed over, refused by the device, decoded on the host
        # The device's own time on the decoded images (CUDA events on the stream; wall time on
        # the host), which decode="auto" weighs against the workers'.
        self.device_seconds = 0.0
        self.timed_images = 0
        self._timing: deque[tuple[Any, Any, int]] = deque()

    def queue(self, blobs: list[bytes], plans: Any, host_decoded: Any, samples: Any,
              epoch: int) -> None:  # fmt: skip
        """A batch's files (b"" where the workers decoded it), plans [B, 19], host_decoded
        flags [B] and samples [B], as the engine made them (host tensors, copied here), and the
        epoch of its pass."""
        flags = np.asarray(host_decoded)
        has_file = np.fromiter((len(b) > 0 for b in blobs), dtype=bool, count=len(blobs))
        rows = np.flatnonzero((flags == 0) & has_file)
        self.host_decoded += len(blobs) - len(rows)
        self.pending.append(
            _Queued(blobs, np.asarray(plans)[rows].copy(), rows, np.asarray(samples).copy(), epoch)
        )

    def __call__(self, images: torch.Tensor) -> list[tuple[int, int, int]]:
        """Decode the next queued batch into `images` (its uint8 [B, C, H, W] on the device,
        written in place). Returns (row, sample, epoch) of each image the device could not
        decode, for the host."""
        queued = self.pending.popleft()
        rows, plans = queued.on_device, queued.plans
        if len(rows) == 0:
            return []
        started = self._start_timer(images)
        pixels = images.permute(0, 2, 3, 1)  # the batch's bytes: NHWC
        failed: list[int] = []
        for group in self._groups(plans):
            failed += self._decode_group(queued, group, pixels)
        self._stop_timer(images, started, len(rows))
        self.device_decoded += len(rows) - len(failed)
        self.device_failed += len(failed)
        return [(row, int(queued.samples[row]), queued.epoch) for row in failed]

    def _groups(self, plans: np.ndarray) -> list[np.ndarray]:
        """Positions in `plans`, largest regions first, cut where a group's padded buffer would
        pass group_bytes."""
        decode = plans[:, resample.DECODE]
        h = (decode[:, 3] - decode[:, 1]).astype(np.int64)
        w = (decode[:, 2] - decode[:, 0]).astype(np.int64)
        order = np.argsort(-(h * w), kind="stable")
        groups, start, max_h, max_w = [], 0, 0, 0
        for i, k in enumerate(order):
            mh, mw = max(max_h, h[k]), max(max_w, w[k])
            if i > start and (i - start + 1) * mh * mw * 3 > self.group_bytes:
                groups.append(order[start:i])
                start, mh, mw = i, h[k], w[k]
            max_h, max_w = mh, mw
        groups.append(order[start:])
        return groups

    def _decode_group(self, queued: _Queued, group: np.ndarray, pixels: torch.Tensor) -> list[int]:
        plans = queued.plans[group]
        decode = plans[:, resample.DECODE].astype(np.int64)
        sizes = np.stack([decode[:, 3] - decode[:, 1], decode[:, 2] - decode[:, 0]], axis=1)
        buffer = torch.empty((len(group), int(sizes[:, 0].max()), int(sizes[:, 1].max()), 3),
                             dtype=torch.uint8, device=pixels.device)  # fmt: skip
        outputs = [buffer[i, : int(hh), : int(ww)] for i, (hh, ww) in enumerate(sizes)]
        regions = np.concatenate([plans[:, [resample.DENOM]].astype(np.int64), decode], axis=1)
        rows = queued.on_device[group]
        done = self.decoder.decode_into([queued.blobs[r] for r in rows], regions, outputs)
        rendered = resample.render(buffer, plans, self.height, self.width, self.channels,
                                   self.fill)  # fmt: skip
        pixels.index_copy_(0, torch.from_numpy(rows).to(pixels.device), rendered)
        return [int(r) for r, ok in zip(rows, done, strict=True) if not ok]

    def _start_timer(self, images: torch.Tensor) -> Any:
        if images.is_cuda:
            start = torch.cuda.Event(enable_timing=True)
            start.record()
            return start
        return time.perf_counter()

    def _stop_timer(self, images: torch.Tensor, started: Any, count: int) -> None:
        if not images.is_cuda:
            self.device_seconds += time.perf_counter() - started
            self.timed_images += count
            return
        end = torch.cuda.Event(enable_timing=True)
        end.record()
        self._timing.append((started, end, count))
        while self._timing and self._timing[0][1].query():  # finished: no wait
            start, stop, n = self._timing.popleft()
            self.device_seconds += start.elapsed_time(stop) / 1e3
            self.timed_images += n

    def clear(self) -> None:
        self.pending.clear()
