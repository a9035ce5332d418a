"""decode="auto": each batch split between the host's worker threads and the device decoder by
their measured rates, so that both finish their share together and the machine gets the sum.

The workers' rate is their threads over their seconds per image decoded on the host (read,
decode and resample, from the engine's stage times); the device's, images over the device's own
seconds on them (CUDA events on its stream). The share of each batch offered to the device is
device rate / (device rate + host rate), smoothed, and given to the engine for the batches it
begins next (Loader.device_share). The first batches run at an even split while neither is
measured. Which images go where then depends on timing, so with decode="auto" a batch's pixels
are each the host's or the device's decode of the same crop (PSNR-close, not bit-equal); samples,
labels and geometry stay exact.
"""

from __future__ import annotations

from dataclasses import dataclass

SMOOTHING = 0.3  # weight of the newest measurement
MIN_IMAGES = 32  # images each side must have decoded since the last update before it counts


@dataclass
class _Totals:
    host_seconds: float = 0.0  # the workers', summed over threads
    host_images: int = 0
    device_seconds: float = 0.0
    device_images: int = 0


def balanced_share(host_rate: float, device_rate: float) -> float:
    """The share of a batch for the device so that both sides take the same time on it."""
    if host_rate <= 0 and device_rate <= 0:
        return 0.5
    return device_rate / (device_rate + host_rate)


class HostDeviceSplit:
    """Keeps decode="auto"'s share up to date from cumulative measurements (``update``)."""

    def __init__(self, share: float = 0.5):
        self.share = share
        self.host_rate = 0.0  # images/s the workers decode, all threads together
        self.device_rate = 0.0
        self._last = _Totals()

    def update(self, totals: _Totals, threads: int) -> float:
        """Take the totals so far (and the workers' thread count now); returns the new share."""
        last = self._last
        host_images = totals.host_images - last.host_images
        device_images = totals.device_images - last.device_images
        if host_images < MIN_IMAGES and device_images < MIN_IMAGES:
            return self.share
        host_s = totals.host_seconds - last.host_seconds
        device_s = totals.device_seconds - last.device_seconds
        if host_images >= MIN_IMAGES and host_s > 0:
            self.host_rate = max(1, threads) * host_images / host_s
        if device_images >= MIN_IMAGES and device_s > 0:
            self.device_rate = device_images / device_s
        self._last = totals
        if self.host_rate > 0 and self.device_rate > 0:
            target = balanced_share(self.host_rate, self.device_rate)
            self.share += SMOOTHING * (target - self.share)
        elif self.device_rate > 0:  # nothing decoded on the host yet: offer it more
            self.share = max(0.0, self.share - 0.1)
        elif self.host_rate > 0:
            self.share = min(1.0, self.share + 0.1)
        return self.share
