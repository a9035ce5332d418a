"""The device stage of decode="gpu": each batch's handed-over JPEGs decoded on the device in one
batched call, each only the region its plan asks for, into a ring buffer (``DecodeRing``), then
rendered into the batch by resample.render, all on the stream of the feed's stage thread
(device.stage_thread), before augment= and normalising."""

from __future__ import annotations

import time
from collections import deque
from typing import Any, NamedTuple

import numpy as np
import torch

from . import resample
from .backends import DecoderFactory, DeviceDecoder, Targets

# A batch's regions are decoded into one buffer, in groups rendered together, each padded to its
# largest image: this bounds a group's padded bytes (the resampler's int32 sums take about four
# times as much again). Each group costs the render's launches once (about 250 kernels): a
# batch of 256 ImageNet-sized regions is one group.
GROUP_BYTES = 256 << 20


class _Queued(NamedTuple):
    blobs: list[bytes]
    plans: np.ndarray  # float64 [k, 19], of the rows handed over
    on_device: np.ndarray  # int64 [k]: the rows handed over
    samples: np.ndarray  # int64 [B]: each row's sample (pack order)
    epoch: int


class DecodeRing:
    """The buffers the device decoder writes a batch's regions into, used in turn (two: one
    being written while the other's batch is still rendered).

    The GPU's hardware JPEG engines write when the decode call is made, not in the order of the
    stream it names, so a buffer is written only once the host has waited for its ``released``
    event, recorded on the stage's stream after the last kernel that reads it. A buffer grows
    (when a batch's regions need more bytes) only after the stream's work is done: a block fresh
    from the caching allocator may have been freed by a kernel queued on that stream that has
    not run yet. Nothing is freed in the middle of a pass (``free`` at its end)."""

    def __init__(self, slots: int = 2):
        self.buffers: list[torch.Tensor | None] = [None] * slots
        self.released: list[Any] = [None] * slots
        self._next = 0
        # Counted, for stats() and the tests: writes into a buffer used before, host waits on
        # its release before them, and buffers allocated.
        self.reuses = 0
        self.release_waits = 0
        self.allocations = 0

    def take(self, nbytes: int, device: torch.device, sync_stream: Any) -> tuple[int, torch.Tensor]:
        """A buffer of at least `nbytes` that nothing reads any more: (its slot, its bytes)."""
        slot = self._next
        self._next = (slot + 1) % len(self.buffers)
        released, self.released[slot] = self.released[slot], None
        if released is not None:
            released.synchronize()
            self.release_waits += 1
        buffer = self.buffers[slot]
        if buffer is not None and buffer.numel() >= nbytes:
            if released is not None:
                self.reuses += 1
            return slot, buffer
        self.buffers[slot] = buffer = None
        sync_stream()
        buffer = torch.empty(max(nbytes, 1), dtype=torch.uint8, device=device)
        self.buffers[slot] = buffer
        self.allocations += 1
        return slot, buffer

    def release(self, slot: int, event: Any) -> None:
        """The event after the last kernel that reads the slot's buffer."""
        self.released[slot] = event

    def free(self) -> None:
        """At the end of a pass, once the stream's work is done."""
        self.buffers = [None] * len(self.buffers)
        self.released = [None] * len(self.released)

    @property
    def bytes(self) -> int:
        return sum(b.numel() for b in self.buffers if b is not None)


class DeviceDecodeStage:
    """Decodes the rows of each batch that the workers handed over (their files' bytes and
    plans, queued by the loader as it hands the batch to the feed) into the batch's images on
    the device. Batches are queued and decoded in the same order, on the feed's stage thread
    (device.stage_thread), whose stream is current at each call; a device's decoder is built in
    the thread of the first pass on that device and kept for the loader's life. Each batch
    renders at its own images' size: the field's, or with buckets= the batch's bucket's."""

    def __init__(self, decoder: DecoderFactory, *, channels: int = 3, fill: int = 0,
                 batch_size: int = 0, group_bytes: int = GROUP_BYTES,
                 ring_slots: int = 2):  # fmt: skip
        self.factory = decoder
        self.decoder: DeviceDecoder | None = None  # the pass's: its device's
        self._decoders: dict[Any, DeviceDecoder] = {}  # by device index
        self._sized: set[Any] = set()  # the device indices whose decoder had its first call
        self.channels, self.fill = channels, fill
        self.batch_size = batch_size
        self.group_bytes = group_bytes
        self.ring = DecodeRing(ring_slots)
        self.pending: deque[_Queued] = deque()
        self.backend: Any = None  # the feed's and the stage thread's stream, from start_pass
        self.stream: Any = None
        self.decode_calls = 0
        self.call_sizes: list[int] = []  # the first calls' sizes (the first few kept)
        self.device_decoded = 0  # images decoded on the device
        self.host_decoded = 0  # decoded by the workers (the file, or decode="auto"'s split)
        self.device_failed = 0  # handed over, refused by the device, decoded on the host
        # The device's own time on the decoded images (CUDA events on the stream; wall time on
        # the host), which decode="auto" weighs against the workers'.
        self.device_seconds = 0.0
        self.timed_images = 0
        self._timing: deque[tuple[Any, Any, int]] = deque()
        # The stage thread's host time in the calls (building the decoder's per-image objects,
        # its submission and its own waits, the render's launches), and their images.
        self.call_seconds = 0.0
        self.call_images = 0

    def seconds_per_timed_image(self) -> float:
        """The device side's seconds on the timed images: the device's own time, or the stage
        thread's host time on as many images where that is longer (the side is as fast as the
        slower of the two)."""
        host = self.call_seconds * self.timed_images / max(1, self.call_images)
        return max(self.device_seconds, host)

    @property
    def max_scale_denom(self) -> int:
        return self.factory.max_scale_denom

    def start_pass(self, backend: Any, stream: Any) -> None:
        """In the stage thread, its stream current, before the pass's first batch."""
        self.backend, self.stream = backend, stream
        index = backend.device.index
        if index not in self._decoders:
            self._decoders[index] = self.factory.build(backend.device)
        self.decoder = self._decoders[index]

    def end_pass(self) -> None:
        """In the stage thread, once its stream's work is done: the stage holds no memory of
        the pass's batches after it."""
        self.ring.free()
        if self.decoder is not None:
            self.decoder.end_pass()

    def close(self) -> None:
        """The loader's close, once the stage thread is stopped: the decoder goes."""
        self.ring.free()
        self.pending.clear()
        self.decoder = None
        self._decoders.clear()
        self._sized.clear()

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
        assert self.decoder is not None, "start_pass builds the decoder"
        called = time.perf_counter()
        started = self._start_timer(images)
        pixels = images.permute(0, 2, 3, 1)  # the batch's bytes: NHWC
        # One decode call for the batch (the engines take it whole), into a ring buffer laid out
        # as groups of images in decreasing size, each group padded to its own largest image, so
        # that each group rendered together is one slice of it.
        # Grouped by Pillow's order of the two passes (so that a group renders in one
        # sequence), then in decreasing size (so that each group's padding stays small).
        across_first = resample.horizontal_first(plans)
        order = np.lexsort((-self._areas(plans), across_first))
        plans, rows, across_first = plans[order], rows[order], across_first[order]
        decode = plans[:, resample.DECODE].astype(np.int64)
        heights, widths = decode[:, 3] - decode[:, 1], decode[:, 2] - decode[:, 0]
        groups = self._groups(heights, widths, across_first)
        blobs = [queued.blobs[r] for r in rows]
        regions = np.concatenate([plans[:, [resample.DENOM]].astype(np.int64), decode], axis=1)
        # The first call sets the hardware engines' batch for the decoder's life (its load hint
        # times the call's size): it is made full size, the smallest image repeated.
        index = self.backend.device.index
        extra = self.batch_size - len(rows) if index not in self._sized else 0
        self._sized.add(index)
        shapes = [(stop - start, int(heights[start:stop].max()), int(widths[start:stop].max()))
                  for start, stop in groups]  # fmt: skip
        if extra > 0:
            shapes.append((extra, int(heights[-1]), int(widths[-1])))
            blobs += [blobs[-1]] * extra
            regions = np.concatenate([regions, np.repeat(regions[-1:], extra, axis=0)])
        slot, buffer = self.ring.take(sum(n * h * w * 3 for n, h, w in shapes), pixels.device,
                                      self._sync_stream)  # fmt: skip
        views, starts, offset = [], [], 0
        for n, h, w in shapes:
            views.append(buffer[offset : offset + n * h * w * 3].view(n, h, w, 3))
            starts.append(offset)
            offset += n * h * w * 3
        # Image i of group g: its group's i-th image, rows as wide as the group's.
        offsets: list[int] = []
        pitches: list[int] = []
        for (n, h, w), start in zip(shapes, starts):
            offsets += range(start, start + n * h * w * 3, h * w * 3)
            pitches += [w * 3] * n
        sizes = regions[:, 3:5] - regions[:, 1:3]  # (width, height) of each region
        targets = Targets(buffer, offsets, pitches, sizes[:, 1].tolist(), sizes[:, 0].tolist())
        done = self.decoder.decode_into(blobs, regions, targets)[: len(rows)]
        self.decode_calls += 1
        if len(self.call_sizes) < 8:
            self.call_sizes.append(len(blobs))
        height, width = pixels.shape[1], pixels.shape[2]
        taps = resample.BatchTaps(plans, height, width, pixels.device)
        for group, (start, stop) in zip(views, groups):  # the padding's view is left out
            rendered = resample.render(group, plans[start:stop], height, width,
                                       self.channels, self.fill,
                                       taps.group(start, stop, plans[start:stop]))  # fmt: skip
            index = torch.from_numpy(rows[start:stop]).to(pixels.device, non_blocking=True)
            pixels.index_copy_(0, index, rendered)
        self.ring.release(slot, self._event())
        failed = [int(r) for r, ok in zip(rows, done, strict=True) if not ok]
        self._stop_timer(images, started, len(rows))
        self.call_seconds += time.perf_counter() - called
        self.call_images += len(rows)
        self.device_decoded += len(rows) - len(failed)
        self.device_failed += len(failed)
        return [(row, int(queued.samples[row]), queued.epoch) for row in failed]

    def _event(self) -> Any:
        """An event at the end of the work queued so far on the stage's stream."""
        return self.backend.event_on(self.stream) if self.backend is not None else None

    def _sync_stream(self) -> None:
        if self.backend is not None:
            self.backend.synchronize(self.stream)

    @staticmethod
    def _areas(plans: np.ndarray) -> np.ndarray:
        decode = plans[:, resample.DECODE]
        return (decode[:, 3] - decode[:, 1]) * (decode[:, 2] - decode[:, 0])

    def _groups(self, heights: np.ndarray, widths: np.ndarray,
                across_first: np.ndarray) -> list[tuple[int, int]]:  # fmt: skip
        """[start, stop) of each group of images rendered together: cut where the order of the
        passes changes, and where a group, padded to its largest, would pass group_bytes."""
        groups, start, max_h, max_w = [], 0, 0, 0
        for i in range(len(heights)):
            mh, mw = max(max_h, int(heights[i])), max(max_w, int(widths[i]))
            too_big = (i - start + 1) * mh * mw * 3 > self.group_bytes
            if i > start and (too_big or across_first[i] != across_first[start]):
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
