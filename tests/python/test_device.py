"""The device feed on a machine without a GPU: the CPU path, the errors, and the slot-reuse
contract checked with a backend whose copies finish late (tests/gpu/ runs the real thing)."""

import contextlib
import ctypes

import pytest
import torch

import stoker
from stoker import device as device_module
from stoker.device import Normalize
from stoker.device import feed as feed_module

pytestmark = pytest.mark.sanitize  # drives the C++ engine: make test-asan-python runs it

MEAN, STD = stoker.IMAGENET_MEAN, stoker.IMAGENET_STD
needs_no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")


def reference_normalize(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """torchvision's ToTensor + Normalize, in float64."""
    mean = torch.tensor(MEAN, dtype=torch.float64).view(1, 3, 1, 1)
    std = torch.tensor(STD, dtype=torch.float64).view(1, 3, 1, 1)
    return ((x.double() / 255 - mean) / std).to(dtype)


# --- without CUDA: clear errors, and the CPU path works ------------------------------------------
@needs_no_cuda
def test_cuda_without_cuda_is_a_clear_error(packed):
    with pytest.raises(stoker.DeviceUnavailableError, match="CUDA build of torch") as e:
        stoker.ImageLoader(packed, batch_size=4, device="cuda")
    assert isinstance(e.value, RuntimeError)
    with pytest.raises(stoker.DeviceUnavailableError, match="built without CUDA"):
        stoker.to_device([torch.zeros(2)], "cuda:0")


def test_bad_device_arguments(packed):
    with pytest.raises(stoker.InvalidArgumentError, match="'cuda' or 'cpu'"):
        stoker.to_device([], "meta")
    with pytest.raises(stoker.InvalidArgumentError, match="give device="):
        stoker.ImageLoader(packed, batch_size=4, mean=MEAN, std=STD)
    with pytest.raises(stoker.InvalidArgumentError, match="together"):
        stoker.ImageLoader(packed, batch_size=4, device="cpu", mean=MEAN)
    with pytest.raises(stoker.InvalidArgumentError, match="one value per channel"):
        stoker.to_device([], "cpu", mean=(0.5, 0.5), std=(0.2,))
    with pytest.raises(stoker.InvalidArgumentError, match="positive"):
        stoker.to_device([], "cpu", mean=(0.5,), std=(0.0,))
    with pytest.raises(stoker.InvalidArgumentError, match="floating type"):
        stoker.to_device([], "cpu", dtype=torch.int32)
    with pytest.raises(stoker.InvalidArgumentError, match="prefetch"):
        stoker.ImageLoader(packed, batch_size=4, device="cpu", device_prefetch=0)
    feed = stoker.to_device([torch.zeros(2, 1, 4, 4, dtype=torch.uint8)], "cpu", mean=MEAN, std=STD)
    with pytest.raises(stoker.InvalidArgumentError, match="3 channels, the images 1"):
        list(feed)
    feed = stoker.to_device([(1, torch.zeros(1))], "cpu", dtype=torch.float16)
    with pytest.raises(stoker.InvalidArgumentError, match="batch\\[0\\] is a int"):
        list(feed)


def test_cpu_path_hands_out_its_own_copies_of_a_sources_tensors():
    """The source may rewrite its buffers once asked for the next batch, which the feed does
    before the loop is done with this one: what it hands out is never the source's memory."""
    batches = [(torch.randint(0, 255, (2, 3, 8, 8), dtype=torch.uint8), torch.arange(2), "meta")]
    out = list(stoker.to_device(batches, "cpu", channels_last=False))
    assert len(out) == 1
    images, labels, meta = out[0]
    assert torch.equal(images, batches[0][0]) and torch.equal(labels, batches[0][1])
    assert images.data_ptr() != batches[0][0].data_ptr() and meta == "meta"
    buffer = torch.zeros(3)

    def rewriting():
        for i in range(5):
            buffer.fill_(i)
            yield buffer

    assert [int(b[0]) for b in stoker.to_device(rewriting(), "cpu", prefetch=3)] == list(range(5))


def test_to_device_keeps_structure_and_delegates_len():
    batches = [
        {"image": torch.full((2, 3, 4, 4), i, dtype=torch.uint8), "label": torch.tensor([i, i])}
        for i in range(5)
    ]
    feed = stoker.to_device(batches, "cpu", dtype=torch.float32, image="image")
    assert len(feed) == 5
    out = list(feed)
    assert [b["label"].tolist() for b in out] == [[i, i] for i in range(5)]
    for i, b in enumerate(out):
        assert b["image"].dtype == torch.float32
        assert b["image"].is_contiguous(memory_format=torch.channels_last)
        torch.testing.assert_close(b["image"], torch.full((2, 3, 4, 4), i / 255.0))
    assert feed.stats()["batches"] == 5


@pytest.mark.parametrize("prefetch", [1, 2, 4])
def test_prefetch_batches_are_in_flight_besides_the_one_handed_out(prefetch):
    pulled = []

    def source():
        for i in range(10):
            pulled.append(i)
            yield torch.full((2,), i)

    it = iter(stoker.to_device(source(), "cpu", prefetch=prefetch))
    for k in range(10 - prefetch):
        assert int(next(it)[0]) == k
        assert len(pulled) == k + 1 + prefetch


def test_an_error_from_the_source_comes_after_the_batches_before_it():
    def source():
        for i in range(3):
            yield torch.full((2,), i)
        raise stoker.CorruptDataError("bad sample", shard="s.tar", key="k")

    got = []
    with pytest.raises(stoker.CorruptDataError, match="bad sample"):
        for batch in stoker.to_device(source(), "cpu", prefetch=2):
            got.append(int(batch[0]))
    assert got == [0, 1, 2]


# --- normalisation --------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_normalize_matches_torchvision_formula(dtype):
    x = torch.randint(0, 256, (4, 3, 17, 9), dtype=torch.uint8)
    y = Normalize(MEAN, STD, dtype)(x)
    assert y.dtype == dtype and y.shape == x.shape
    assert y.is_contiguous(memory_format=torch.channels_last)
    expected = reference_normalize(x, torch.float64)
    # float32 arithmetic, then one rounding to dtype: within a float32 ulp before the cast.
    assert (y.double() - expected).abs().max() <= {
        torch.float32: 2e-6,
        torch.bfloat16: 2.0**-8 * 2.7,  # half an ulp at |y| <= 2.7
        torch.float16: 2.0**-11 * 2.7,
    }[dtype]


def test_normalize_float_input_is_not_modified_in_place():
    x = torch.rand(2, 3, 5, 5)
    before = x.clone()
    y = Normalize(MEAN, STD)(x)
    assert torch.equal(x, before)
    mean = torch.tensor(MEAN).view(1, 3, 1, 1)
    std = torch.tensor(STD).view(1, 3, 1, 1)
    torch.testing.assert_close(y, (x - mean) / std)


# --- ImageLoader(device="cpu") --------------------------------------------------------------------
def test_loader_on_cpu_device_equals_host_batches_normalised(packed):
    kwargs = dict(batch_size=8, size=48, threads=2, seed=7, return_index=True)
    host = [(i.clone(), y.clone(), x.clone()) for i, y, x in stoker.ImageLoader(packed, **kwargs)]
    loader = stoker.ImageLoader(
        packed, device="cpu", dtype=torch.bfloat16, mean=MEAN, std=STD, **kwargs
    )
    assert loader.device == torch.device("cpu") and "device='cpu'" in repr(loader)
    out = list(loader)
    assert len(out) == len(host) == 5
    for (images, labels, indices), (h_images, h_labels, h_indices) in zip(out, host):
        assert images.dtype == torch.bfloat16 and images.shape == (len(labels), 3, 48, 48)
        assert images.is_contiguous(memory_format=torch.channels_last)
        assert torch.equal(images, Normalize(MEAN, STD, torch.bfloat16)(h_images))
        assert torch.equal(labels, h_labels) and torch.equal(indices, h_indices)
    assert loader.stats()["device"]["batches"] == 5


@pytest.mark.parametrize("through", ["device", "to_device"])
def test_state_is_as_of_the_last_batch_handed_out_not_those_in_flight(packed, through):
    """The feed pulls `prefetch` batches ahead of the training loop; a checkpoint must not skip
    them on resume."""
    kwargs = dict(batch_size=4, size=32, threads=2, seed=5, return_index=True)

    def make():
        if through == "device":
            return stoker.ImageLoader(packed, device="cpu", device_prefetch=3, **kwargs)
        return stoker.to_device(stoker.ImageLoader(packed, **kwargs), "cpu", prefetch=3)

    full = [b[2].tolist() for b in make()]
    assert len(full) == 9
    first = make()
    it = iter(first)
    seen = [next(it)[2].tolist() for _ in range(4)]
    state = first.state_dict()
    assert state["batches_done"] == 4  # the engine itself is 3 batches further on
    resumed = make()
    resumed.load_state_dict(state)
    rest = [b[2].tolist() for b in resumed]
    assert seen + rest == full
    # After a whole pass the state is the next epoch's start.
    assert resumed.state_dict()["epoch"] == 1 and resumed.state_dict()["batches_done"] == 0


@pytest.mark.parametrize("through", ["device", "to_device"])
@pytest.mark.parametrize("stop_at", [6, 7, 8])
def test_a_break_near_the_end_leaves_the_epoch_as_the_host_loader_does(packed, through, stop_at):
    """The feed pulls `prefetch` batches ahead; the pull that ends the loader's pass (and so its
    epoch) waits until the loop asks for a batch past the last: a `break` at any batch leaves the
    epoch where a host loader's break leaves it, and the next pass repeats that epoch."""
    kwargs = dict(batch_size=4, size=32, threads=2, seed=5, return_index=True)

    def passes(loader):
        it = iter(loader)
        first = [next(it)[2].tolist() for _ in range(stop_at + 1)]
        del it  # the `break`
        state = loader.state_dict()
        second = [b[2].tolist() for b in loader]
        return first, state, second, loader.state_dict()

    host = passes(stoker.ImageLoader(packed, **kwargs))
    if through == "device":
        fed = stoker.ImageLoader(packed, device="cpu", device_prefetch=3, **kwargs)
    else:
        fed = stoker.to_device(stoker.ImageLoader(packed, **kwargs), "cpu", prefetch=3)
    assert len(fed) == 9
    got = passes(fed)
    assert got[1] == host[1] and got[1]["epoch"] == 0 and got[1]["batches_done"] == stop_at + 1
    assert got[2] == host[2] == host[0] + got[2][stop_at + 1:]  # epoch 0 again, from its start
    assert got[3]["epoch"] == host[3]["epoch"] == 1


def test_break_gives_slots_back_and_next_pass_starts_clean(packed):
    loader = stoker.ImageLoader(packed, batch_size=4, size=32, device="cpu", device_prefetch=2)
    for i, _ in enumerate(loader):
        if i == 2:
            break
    assert len(list(loader)) == 9  # a new pass, from the start of the epoch
    loader.close()
    with pytest.raises(stoker.InvalidArgumentError, match="closed"):
        iter(loader)


# --- the slot-reuse contract, with copies that finish late ----------------------------------------
class LateEvent:
    """Completes on its `polls`-th query (or on synchronize). When it completes it checks that the
    host memory its copies read still holds what it held when they were issued: a feed that gave
    a slot back early lets the engine overwrite it while the "DMA" is still running."""

    def __init__(self, backend, copies, polls):
        self.backend, self.copies, self.polls, self.done = backend, copies, polls, False

    def intact(self):
        return all(torch.equal(host, snapshot) for host, snapshot in self.copies)

    def _complete(self):
        if not self.done:
            self.done = True
            self.backend.corrupted += not self.intact()
            self.backend.pending -= bool(self.copies)

    def query(self):
        self.backend.check_in_flight()
        self.polls -= 1
        if self.polls <= 0:
            self._complete()
        return self.done

    def synchronize(self):
        self.backend.waited += 1
        self._complete()


class LateBackend:
    """A stand-in for _CudaBackend on the CPU: pinning is bookkeeping, a copy snapshots its source,
    and its completion is only known some queries later."""

    pins_host_memory = True

    def __init__(self, polls=3):
        # A label: what the feed compares tensors' devices with. Tensors stay on the CPU.
        self.device = torch.device("cuda", 0)
        self.polls = polls
        self.pinned: dict[int, int] = {}  # address -> bytes
        self.pin_calls = 0
        self.unpinned_while_copying = 0
        self.corrupted = self.pending = self.waited = 0
        self.handed_over = 0
        self._copies = []
        self._events = []
        self._staging = set()
        self._keep = []

    def check_in_flight(self):
        """Every copy not yet complete must still find its source as it was."""
        self._events = [e for e in self._events if not e.done]
        self.corrupted += sum(not e.intact() for e in self._events)

    def bind(self):
        pass

    def guard(self):
        return contextlib.nullcontext()

    def pin(self, address, nbytes):
        assert address not in self.pinned, "a slot was page-locked twice"
        self.pin_calls += 1
        self.pinned[address] = nbytes
        return True

    def unpin(self, address):
        self.unpinned_while_copying += self.pending > 0
        del self.pinned[address]

    def is_pinned(self, tensor):
        return tensor.data_ptr() in self._staging or any(
            a <= tensor.data_ptr() < a + n for a, n in self.pinned.items()
        )

    def pinned_like(self, like):
        t = torch.empty_like(like)
        self._staging.add(t.data_ptr())
        self._keep.append(t)  # never freed: no other tensor can take its address
        return t

    def side_stream(self):
        return contextlib.nullcontext()

    def wait_for_producers(self, devices):
        pass

    def read_on_side(self, tensor):
        pass

    def mark_consumer(self):
        return LateEvent(self, [], self.polls)

    def copy(self, host):
        assert self.is_pinned(host), "a copy from pageable memory"
        # The "DMA" reads the bytes without owning them, as the GPU does: holding the tensor
        # would keep the slot leased and hide an early release.
        nbytes = host.numel() * host.element_size()
        raw = torch.frombuffer(
            (ctypes.c_uint8 * nbytes).from_address(host.data_ptr()), dtype=torch.uint8
        )
        self._copies.append((raw, raw.clone()))
        return host.clone()

    def record_event(self):
        self.check_in_flight()
        copies, self._copies = self._copies, []
        self.pending += bool(copies)
        event = LateEvent(self, copies, self.polls)
        self._events.append(event)
        return event

    def wait(self, event):
        pass

    def hand_over(self, tensor):
        self.handed_over += 1


@pytest.mark.parametrize("polls", [1, 4, 50])
def test_slots_are_pinned_once_and_reused_only_after_their_copy(packed, monkeypatch, polls):
    backend = LateBackend(polls)
    monkeypatch.setattr(device_module, "device_backend", lambda device: backend)
    kwargs = dict(batch_size=4, size=32, threads=2, seed=11, prefetch=1, return_index=True)
    expected = [(i.clone(), x.clone()) for i, _, x in stoker.ImageLoader(packed, **kwargs)]
    loader = stoker.ImageLoader(packed, device="cuda", dtype=torch.float32, **kwargs)
    for _ in range(3):
        loader.set_epoch(0)  # the same batches each time: compared with `expected`
        got = [(images, indices) for images, _, indices in loader]
        assert len(got) == len(expected)
        for (images, indices), (h_images, h_indices) in zip(got, expected):
            assert torch.equal(indices, h_indices)
            assert torch.equal(images, h_images.float() / 255)
    assert backend.corrupted == 0, "host memory was reused while its copy was in flight"
    stats = loader.stats()
    assert stats["device"]["staged_bytes"] == 0  # the slots themselves are page-locked
    # Each slot is page-locked once and the slots stay few: the engine's window (1), the feed's
    # in-flight batches (2), those still being copied (2), and one changing hands.
    assert backend.pin_calls == stats["device"]["pinned_slots"] == loader._engine.slots_allocated
    assert backend.pin_calls <= 1 + 2 + 2 + 1
    if polls == 50:
        assert backend.waited > 0  # the host waited for copies only when it had to
    assert backend.handed_over == 3 * 9 * 3  # images, labels, indices of every batch
    loader.close()
    assert backend.pinned == {} and backend.unpinned_while_copying == 0


def test_to_device_stages_pageable_batches_into_reused_pinned_buffers(monkeypatch):
    backend = LateBackend(polls=3)
    monkeypatch.setattr(feed_module, "device_backend", lambda device: backend)
    source = torch.zeros(8, 3, 16, 16, dtype=torch.uint8)

    def producer():  # writes every batch into the same pageable buffer, as a careless loader might
        for i in range(40):
            source.fill_(i)
            yield source, torch.full((8,), i)

    out = [(x.clone(), y.clone()) for x, y in stoker.to_device(producer(), "cuda", prefetch=2)]
    assert [int(x[0, 0, 0, 0]) for x, _ in out] == list(range(40))
    assert [int(y[0]) for _, y in out] == list(range(40))
    assert backend.corrupted == 0
    feed_stats = stoker.to_device([], "cuda").stats()
    assert feed_stats["staging_buffers"] == 0
    feed = stoker.to_device(producer(), "cuda", prefetch=2)
    list(feed)
    stats = feed.stats()
    assert stats["staged_bytes"] == 40 * (8 * 3 * 16 * 16 + 8 * 8) and stats["direct_bytes"] == 0
    # Two tensors a batch, each buffer reused once its copy is done: a handful, not 80.
    assert stats["staging_buffers"] <= 2 * (2 + 2 + 1)


# --- the CUDA backend's protocol, against a stand-in torch.cuda -----------------------------------
def test_device_errors_name_what_is_missing(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    with pytest.raises(stoker.DeviceUnavailableError, match="sees no GPU.*CUDA_VISIBLE_DEVICES"):
        device_module.device_backend("cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(stoker.DeviceUnavailableError, match="has 1 GPU"):
        device_module.device_backend("cuda:3")
