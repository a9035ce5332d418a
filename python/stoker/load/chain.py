"""How a Loader's checked options become its chain of stages (stoker.load.stages): what the
engine is asked to do (each field's spec, the augmentations its workers run, which files go to a
device decoder, whether it keeps its slots for page-locking or only makes indices), then the
stages each option adds, in their order. The one place that knows which option asks for which
stage."""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Callable
from typing import Any

from .. import _core
from ..errors import InvalidArgumentError
from .fields import Image
from .layout import DictLayout
from .options import LoaderOptions, default_cpu_budget
from .stages import Stage
from .stages.engine import EnginePass, engine_threads


@dataclasses.dataclass
class Preset:
    """What a preset of the Loader (ImageLoader, TokenLoader) sets beyond its options: how its
    batches look (`layout`: None for the fields' dict), what opening its data takes
    (`dataset_options`), and what holds its data on a GPU under resident=True
    (`device_data(dataset, fields, engine, device)`; None: an array pack's columns)."""

    layout: Any = None
    dataset_options: dict[str, Any] = dataclasses.field(default_factory=dict)
    device_data: Callable[..., Any] | None = None


@dataclasses.dataclass
class Chain:
    """A loader's stages: the last (what a pass iterates), the engine's, and the parts the
    loader's own methods reach."""

    top: Stage
    engine: EnginePass
    backend: Any = None
    augment: Any = None  # the Pipeline, when augment= is given
    map: Any = None  # the MapStage, when map= is given
    held: Any = None  # resident=True on a GPU: what holds the data there
    pins: Any = None  # the PinSlots stage, with a device that page-locks host memory
    normalize: Any = None  # what converts the images on the device (the feed's, or resident's)
    groups: Any = None  # buckets= or group_by=: the GroupPlan (stoker.load.grouping)

    def find(self, kind: type) -> Any:
        """The chain's stage of `kind` (None if it has none), the device feed's too."""
        stage: Any = self.top
        while stage is not None:
            if isinstance(stage, kind):
                return stage
            for inner in getattr(stage, "device_stages", ()):
                if isinstance(inner, kind):
                    return inner
            stage = stage.source
        return None


@dataclasses.dataclass
class Plan:
    """What a loader's options ask of its chain, worked out before anything is acquired: every
    check that needs only the options and the fields (the device, augment=, decode=) has passed
    once a Plan exists."""

    backend: Any  # the device feed's, or None
    images: tuple[str, ...]  # the Image fields
    on_gpu: bool  # batches go to a GPU (or, in tests, the resident path's CPU stand-in)
    resident_gpu: bool
    on_host: bool  # no device, or device="cpu"
    pipeline: Any = None  # augment='s
    augment_keys: tuple[str, Any] = ("", None)
    decode: Any = None  # decode="gpu"/"auto"'s device stage
    split: Any = None
    note: str = ""
    decode_key: str = ""


def plan(options: LoaderOptions, fields: dict[str, Any], torch_on_cpu: bool) -> Plan:
    """The checks of a loader's options against its fields, and what they ask for."""
    from .stages import augment as augment_stage
    from .stages import decode as decode_stage

    backend = None
    if options.device is not None:
        from ..device import device_backend

        backend = device_backend(options.device)  # a clear error now if there is no GPU
    on_gpu = backend is not None and (backend.device.type == "cuda" or torch_on_cpu)
    images = tuple(n for n, f in fields.items() if isinstance(f, Image))
    on_host = backend is None or backend.device.type == "cpu"
    p = Plan(backend, images, on_gpu, options.resident and on_gpu, on_host)
    if options.augment is not None:
        p.pipeline, p.augment_keys = augment_stage.plan(options.augment, fields, p.resident_gpu)
    gpu = [n for n, f in fields.items() if isinstance(f, Image) and f.decode != "host"]
    if len(gpu) > 1:
        raise InvalidArgumentError(
            f"decode='gpu' or 'auto' is for one Image field of a loader, not {len(gpu)}"
        )
    if gpu and options.remote_workers is not None:
        raise InvalidArgumentError(
            "decode='gpu'/'auto' decodes on this machine's GPU; with remote_workers the "
            "images are decoded where the workers run: decode='host'"
        )
    if options.grouped:
        _check_grouping(options, fields, p.resident_gpu)
    if gpu:
        p.decode, p.split, p.note = decode_stage.plan(fields[gpu[0]], options.map is not None,
                                                      options.resident, backend,
                                                      options.batch_size)  # fmt: skip
        p.decode_key = gpu[0] if p.decode is not None else ""
    return p


def build(owner: Any, options: LoaderOptions, p: Plan, fields: dict[str, Any], dataset: Any,
          remote: Any, preset: Preset,
          stack: contextlib.ExitStack) -> tuple[Chain, Any]:  # fmt: skip
    """The chain of a loader (`owner`, which the device feed's pass keeps alive), and the
    dataset it reads (held in host memory under resident=True). Each stage's close is entered
    into `stack` as soon as the stage exists: a failure part way closes those built, last first
    (the caller's ExitStack), and closing the stack later closes the whole chain."""
    from .stages import augment as augment_stage
    from .stages import decode as decode_stage

    def entered(stage: Any) -> Any:
        stack.callback(stage.close)
        return stage

    backend, pipeline, decode = p.backend, p.pipeline, p.decode
    if options.resident:
        dataset = _held_in_memory(dataset, p.on_gpu)
    specs = [f._spec(name, options.train) for name, f in fields.items()]
    groups = _plan_groups(options, fields, specs, dataset, remote)
    # map= runs before augment= on the batch: with it, every op stays on the batch too. With
    # buckets the images' sizes differ batch by batch: every op runs on the batch.
    if pipeline is not None and p.on_host and options.map is None and options.buckets is None:
        # On the host, the ops that have a worker form run in the workers, on each image as it
        # is decoded: the training thread runs only the rest (and the mix).
        at = list(fields).index(p.augment_keys[0])
        target = fields[p.augment_keys[0]]
        if isinstance(target, Image) and target.channels == 3:
            o = specs[at].image
            o.augment = pipeline.engine_steps(o.height, o.width)
    for spec in specs:  # decode="auto" without a device decoder decodes on the host
        if decode is not None and spec.name == p.decode_key:
            spec.image.device_decode = True
            spec.image.device_max_scale_denom = decode.max_scale_denom
        elif isinstance(fields[spec.name], Image):
            spec.image.device_decode = False
    # Slots that stay at one address (keep_slots) can stay page-locked; float32 unless told on
    # a GPU's resident path, which converts there.
    pin = backend is not None and backend.pins_host_memory and not p.resident_gpu
    budget = default_cpu_budget() if options.cpu_budget is None else options.cpu_budget
    if decode is not None:  # the device decode's stage thread takes a core of the budget
        budget = max(1, budget - 1)
    # A Video's decoder threads where not given: the CPU budget over the loader's threads.
    threads = max(1, engine_threads(options, budget))
    for spec in specs:
        if spec.kind == _core.FieldKind.video and spec.video.decoder_threads == 0:
            spec.video.decoder_threads = max(1, min(8, budget // threads))
    workers = options.remote_workers is not None
    if workers:  # the engine here makes the steps' indices; the workers make the batches
        pin = False
        engine = EnginePass(dataset, remote, fields, specs,
                            dataclasses.replace(options, threads=1), 1, keep_slots=False,
                            load_samples=False, groups=groups)  # fmt: skip
    else:
        engine = EnginePass(dataset, remote, fields, specs, options, budget, keep_slots=pin,
                            load_samples=not p.resident_gpu, groups=groups)  # fmt: skip
    stage: Stage = entered(engine)
    chain = Chain(top=engine, engine=engine, backend=backend, augment=pipeline, groups=groups)
    layout = preset.layout or DictLayout(p.images, p.augment_keys)
    if workers:
        from .stages.workers import WorkerSteps
        from .workers import open_workers

        dispatcher = open_workers(owner, options, augment_on_workers=p.on_host)
        stack.callback(dispatcher.close)
        stage = WorkerSteps(engine, dispatcher)
    if options.record is not None:
        from .stages.record import RecordSteps

        stage = entered(RecordSteps(stage, engine, options.record))
    if p.resident_gpu:
        stage = entered(_resident_gather(stage, engine, fields, dataset, options, backend,
                                         preset, p.images, chain))  # fmt: skip
    if pin:
        from .stages.pin import PinSlots

        stage = chain.pins = entered(PinSlots(stage, backend, engine.engine.slot_bytes))
    if decode is not None:
        stage = entered(decode_stage.DeviceDecodeQueue(stage, engine, decode, p.split,
                                                       p.decode_key))  # fmt: skip
    elif p.note:
        stage = decode_stage.HostDecodeNote(stage, p.note)
    if options.map is not None and not workers:  # with workers, it runs there
        from .stages.map import MapSamples

        threads = options.map_threads if options.map_threads is not None else os.cpu_count() or 1
        mapped = entered(MapSamples(stage, options.map, threads, options.seed, set(p.images)))
        stage, chain.map = mapped, mapped.map
    with_index = options.return_index or pipeline is not None
    from .stages.format import FormatBatch

    stage = FormatBatch(stage, layout, with_index)
    augment = (augment_stage.AugmentBatch(None, pipeline, layout, engine, options.seed,
                                          options.return_index) if pipeline else None)  # fmt: skip
    if backend is None or p.resident_gpu:
        if augment is not None:  # on the host, in the thread that takes the batch
            augment.source = stage
            stage = augment
    else:
        from .stages.feed import DeviceFeedStage

        device_stages: list[Stage] = []
        if decode is not None:
            key = layout.key(p.decode_key)
            device_stages.append(entered(decode_stage.DeviceDecode(decode, key, engine, layout,
                                                                   with_index)))  # fmt: skip
        if augment is not None:
            device_stages.append(augment)
        feed = entered(DeviceFeedStage(stage, owner, backend, options, layout.image_keys,
                                       device_stages, decode))  # fmt: skip
        stage, chain.normalize = feed, feed.feed.normalize
    chain.top = stage
    return chain, dataset


def _check_grouping(options: LoaderOptions, fields: dict[str, Any], resident_gpu: bool) -> None:
    """buckets= or group_by= against the other options and the fields."""
    from .buckets import VideoBuckets
    from .geometry import CoverCrop
    from .grouping import bucket_field

    if resident_gpu:
        raise InvalidArgumentError(
            "buckets= and group_by= make batches on the host; resident=True on a GPU gathers "
            "fixed batches there: give one or the other"
        )
    if options.buckets is None:
        return
    name = bucket_field(fields, options.buckets)
    field = fields[name]
    geometry = field.geometry
    if geometry is not None and not isinstance(geometry, CoverCrop):
        raise InvalidArgumentError(
            f"buckets= crops {name!r} to its bucket (stoker.CoverCrop): leave its geometry out, "
            f"not {geometry!r}"
        )
    if isinstance(options.buckets, VideoBuckets):
        if field.fps is not None and field.fps != options.buckets.fps:
            raise InvalidArgumentError(
                f"Video {name!r} has fps={field.fps} and its VideoBuckets fps="
                f"{options.buckets.fps:g}: give it once (the buckets' is the clips')"
            )
        if field.stride != 1:
            raise InvalidArgumentError(
                f"VideoBuckets take frames by time (fps): leave Video {name!r}'s stride out"
            )


def _plan_groups(options: LoaderOptions, fields: dict[str, Any], specs: list[Any],
                 dataset: Any, remote: Any = None) -> Any:  # fmt: skip
    """buckets= or group_by=: the group of every sample (stoker.load.grouping); with buckets,
    the sized Image crops with CoverCrop (random when training) to its batch's bucket."""
    if not options.grouped:
        return None
    from . import grouping
    from .buckets import VideoBuckets

    if options.buckets is not None:
        name = grouping.bucket_field(fields, options.buckets)
        geometry = fields[name].geometry
        random = None if geometry is None else geometry.random
        spec = specs[list(fields).index(name)]
        if isinstance(options.buckets, VideoBuckets):
            spec.video.fps = options.buckets.fps
            g = spec.video.geometry
        else:
            g = spec.image.geometry
        g.kind = _core.GeometryKind.cover_crop
        g.random_position = options.train if random is None else bool(random)
    assert options.leftovers is not None  # grouped
    return grouping.plan(dataset, fields, options.batch_size, options.buckets,
                         options.group_by, options.leftovers,
                         options.same_shape_across_ranks, remote)  # fmt: skip


def _held_in_memory(dataset: Any, on_gpu: bool) -> Any:
    """resident=True: the pack read into host memory (on a GPU, the data goes there instead,
    later: the engine then reads nothing)."""
    from .stages import resident as held

    if on_gpu:
        return dataset
    available, total = held.host_memory()
    held.check_fits(dataset.resident_bytes, "host", available, total)
    return dataset.resident()


def _resident_gather(stage: Stage, engine: EnginePass, fields: dict[str, Any], dataset: Any,
                     options: LoaderOptions, backend: Any, preset: Preset,
                     images: tuple[str, ...], chain: Chain) -> Stage:  # fmt: skip
    import torch

    from ..device import Normalize
    from .stages.resident import DeviceColumns, ResidentGather

    dtype = options.dtype if options.dtype is not None else torch.float32
    normalize = Normalize(options.mean, options.std, dtype)
    make = preset.device_data or DeviceColumns
    chain.held = make(dataset, fields, engine.engine, backend.device)
    chain.normalize = normalize
    return ResidentGather(stage, chain.held, normalize, set(images))
