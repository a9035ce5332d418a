"""The GPU feed: batches copied to the device from page-locked memory on a side stream, converted
and normalised there, handed over safely to the training stream.

What it does per batch (docs/GPU.md has the why and every contract):

1. The batch's host tensors must be in page-locked (pinned) memory, or the copy is neither
   asynchronous nor at full bandwidth. An ImageLoader's slots are page-locked once, in place,
   and stay so; other pinned tensors go as they are; anything else is first copied into a pinned
   staging buffer taken from a small pool. Where page-locking in place fails (WSL2, some
   confidential-computing machines), slots are staged like anything else, with one warning.
2. On the feed's own CUDA stream, which first waits for the work already queued on the stream
   current at ``next()`` (and on the current stream of a GPU the source's tensors live on): the
   copies (``non_blocking``), an event ``copied``, then the conversion to ``dtype`` and the
   normalisation in channels_last, then an event ``ready``.
3. ``prefetch`` batches are launched ahead. Handing a batch over, the stream current at
   ``next()`` waits for ``ready`` (on the GPU, not the host) and each output tensor is
   ``record_stream``-ed on it, so that the caching allocator does not give that memory to the
   side stream again before the training stream is done with it.
4. Host memory is given back only after its ``copied`` event has completed. A source's own
   buffers (not an ImageLoader's leased slots) may be rewritten as soon as the source is asked
   for its next batch: the feed never hands them out (a tensor already on the device is copied
   too), and asks only once the previous batch's copies of them are done.
5. The host runs at most ``_MAX_UNCONSUMED`` batches ahead of the training stream: past that it
   waits, so that outputs kept alive by ``record_stream`` cannot pile up on the device.

Every CUDA call is made with the feed's own device current (``torch.cuda.device``), so that a
feed for ``cuda:1`` never touches (or creates a context on) GPU 0. All CUDA calls go through
``_CudaBackend``. ``_HostBackend`` is the same path on the CPU (no copy, no stream: the events are
complete at once), so that everything but the CUDA calls runs in CI; the tests plug in stand-ins
for torch.cuda whose copies finish late, whose streams lag, and which record the device current
at every call.

The modules, one concern each: ``backend`` (the CUDA backend and the host one, page-locking,
``device_backend``), ``normalize`` (``Normalize``, the exact conversion), ``feed`` (``DeviceFeed``
and its pass, the in-flight bookkeeping, the staging buffers, ``to_device``), ``stage_thread``
(a device stage on a thread and CUDA stream of its own: decode="gpu"'s), ``gpu_decode``
(decode="gpu"'s device half) and ``batches`` (the helpers over nested batches).
"""

# Besides the public names, the private ones imported from here: the doctor's batch helpers, and
# the tests' CUDA backend and bound on unconsumed batches.
from .backend import _CudaBackend as _CudaBackend
from .backend import device_backend
from .batches import _map_tensors as _map_tensors
from .batches import _tensors as _tensors
from .feed import _MAX_UNCONSUMED as _MAX_UNCONSUMED
from .feed import DeviceFeed, to_device
from .normalize import IMAGENET_MEAN, IMAGENET_STD, Normalize

__all__ = [
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "DeviceFeed",
    "Normalize",
    "device_backend",
    "to_device",
]
