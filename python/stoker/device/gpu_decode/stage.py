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

# A batch's regions are decoded into one buffer, in decreasing size; groups of them are rendered
# together, each cut to its largest image: this bounds a group (the resampler's int32 sums take
# about twice as much again).
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
        # One decode call for the batch (the engines take it whole), into one buffer whose
        # images are in decreasing size, so that each group rendered together is a slice of it
        # cut to its own largest image.
        order = np.argsort(-self._areas(plans), kind="stable")
        plans, rows = plans[order], rows[order]
        decode = plans[:, resample.DECODE].astype(np.int64)
        heights, widths = decode[:, 3] - decode[:, 1], decode[:, 2] - decode[:, 0]
        buffer = torch.empty((len(rows), int(heights.max()), int(widths.max()), 3),
                             dtype=torch.uint8, device=pixels.device)  # fmt: skip
        sizes = zip(heights.tolist(), widths.tolist(), strict=True)
        outputs = [buffer[i, :h, :w] for i, (h, w) in enumerate(sizes)]
        regions = np.concatenate([plans[:, [resample.DENOM]].astype(np.int64), decode], axis=1)
        done = self.decoder.decode_into([queued.blobs[r] for r in rows], regions, outputs)
        for start, stop in self._groups(heights, widths):
            group = buffer[start:stop, : int(heights[start:stop].max()),
                           : int(widths[start:stop].max())]  # fmt: skip
            rendered = resample.render(group, plans[start:stop], self.height, self.width,
                                       self.channels, self.fill)  # fmt: skip
            index = torch.from_numpy(rows[start:stop]).to(pixels.device, non_blocking=True)
            pixels.index_copy_(0, index, rendered)
        failed = [int(r) for r, ok in zip(rows, done, strict=True) if not ok]
        self._stop_timer(images, started, len(rows))
        self.device_decoded += len(rows) - len(failed)
        self.device_failed += len(failed)
        return [(row, int(queued.samples[row]), queued.epoch) for row in failed]

    @staticmethod
    def _areas(plans: np.ndarray) -> np.ndarray:
        decode = plans[:, resample.DECODE]
        return (decode[:, 3] - decode[:, 1]) * (decode[:, 2] - decode[:, 0])

    def _groups(self, heights: np.ndarray, widths: np.ndarray) -> list[tuple[int, int]]:
        """[start, stop) of each group of images (in decreasing size) rendered together: cut
        where a group, padded to its largest, would pass group_bytes."""
        groups, start, max_h, max_w = [], 0, 0, 0
        for i in range(len(heights)):
            mh, mw = max(max_h, int(heights[i])), max(max_w, int(widths[i]))
            if i > start and (i - start + 1) * mh * mw * 3 > self.group_bytes:
                groups.append((start, i))
                start, mh, mw = i, int(heights[i]), int(widths[i])
            max_h, max_w = mh, mw
        groups.append((start, len(heights)))
        return groups

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
