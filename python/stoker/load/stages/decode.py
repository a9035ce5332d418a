"""decode="gpu" and decode="auto" (stoker.device.gpu_decode): the host half queues each batch's
handed-over files, plans and samples for the device stage and keeps decode="auto"'s split up to
date; the device half, inside the device feed on its side stream, decodes them into the batch
and sends what the device could not decode back to the engine, whose outcome is the host path's
(pixels, or on_error's: the sample raised, left out, or replaced in every field)."""

from __future__ import annotations

from typing import Any

from ...errors import DeviceUnavailableError, InvalidArgumentError
from . import HostBatch, Stage
from .engine import EnginePass


def plan(field: Any, map_given: bool, resident: bool, backend: Any,
         batch_size: int) -> tuple[Any, Any, str]:  # fmt: skip
    """decode="gpu"/"auto" checked against the loader: (the device stage, decode="auto"'s
    split, a note saying why "auto" decodes on the host only); the stage None where decode
    "auto" finds no device decoder."""
    from ...device import gpu_decode

    if resident:
        raise InvalidArgumentError(
            f"decode={field.decode!r} reads encoded files: not with resident=True"
        )
    if map_given:
        raise InvalidArgumentError(
            f"decode={field.decode!r} decodes on the device, after map= would see the "
            "images: not both"
        )
    if field.decode == "auto" and backend is None:
        return None, None, "decode='auto' splits work with a GPU: give device='cuda'"
    if backend is None:
        raise InvalidArgumentError(
            "decode='gpu' decodes on the device the batches go to: give device='cuda'"
        )
    try:
        decoder = gpu_decode.decoder_for(backend.device, batch_size)
    except DeviceUnavailableError as e:
        if field.decode == "gpu":
            raise
        return None, None, f"decode='auto' decodes on the host: {e}"
    fill = int(getattr(field.geometry, "fill", 0) or 0)
    split = gpu_decode.HostDeviceSplit() if field.decode == "auto" else None
    stage = gpu_decode.DeviceDecodeStage(decoder, channels=field.channels, fill=fill,
                                         batch_size=batch_size)  # fmt: skip
    return stage, split, ""


class DeviceDecodeQueue(Stage):
    """Queues each batch's handed-over files for the device stage (the feed runs it on the
    batches in the order they were queued); brings decode="auto"'s split up to date."""

    def __init__(self, source: Stage, engine: EnginePass, decode: Any, split: Any, field: str):
        super().__init__(source)
        self.engine, self.decode, self.split, self.field = engine, decode, split, field
        self.positions = next(p for name, _, p in engine.plan if name == field)
        if split is not None:
            engine.engine.device_share = split.share

    def __iter__(self) -> Any:
        self.decode.clear()  # what an abandoned pass queued
        return super().__iter__()

    def apply(self, batch: HostBatch) -> HostBatch:
        p, engine = self.positions, self.engine
        files = batch.blobs[engine.blob_fields.index(self.field)]
        self.decode.queue(files, batch.outputs[p[2]], batch.outputs[p[3]], batch.indices,
                          batch.epoch)  # fmt: skip
        if self.split is not None:
            from ...device.gpu_decode.split import _Totals

            seconds = engine.engine.stats()["seconds"]
            totals = _Totals(
                host_seconds=seconds["read"] + seconds["decode"] + seconds["transform"],
                host_images=self.decode.host_decoded,
                device_seconds=self.decode.seconds_per_timed_image(),
                device_images=self.decode.timed_images,
            )
            engine.engine.device_share = self.split.update(totals, engine.engine.threads)
        return batch

    def stats(self, into: dict[str, Any]) -> None:
        super().stats(into)
        stage = self.decode
        into["decode"] = {
            "device": stage.device_decoded,
            "host": stage.host_decoded + stage.device_failed,
            "device_failed": stage.device_failed,  # decoded again on the host
            "device_seconds": stage.device_seconds,  # the device's own, on timed_images
            "timed_images": stage.timed_images,
            "stage_seconds": stage.call_seconds,  # the stage thread's host time in decode calls
            "decode_calls": stage.decode_calls,
            "ring_bytes": stage.ring.bytes,
            "ring_release_waits": stage.ring.release_waits,
        }
        if self.split is not None:
            into["decode"].update(
                share=self.engine.engine.device_share,
                host_rate=self.split.host_rate,
                device_rate=self.split.device_rate,
            )


class HostDecodeNote(Stage):
    """decode="auto" where there is no device decoder: the host decodes everything; stats()
    says why."""

    def __init__(self, source: Stage, note: str):
        super().__init__(source)
        self.note = note

    def stats(self, into: dict[str, Any]) -> None:
        super().stats(into)
        into["decode"] = {"device": 0, "note": self.note}


class DeviceDecode(Stage):
    """The device half, a device stage of the feed: the queued files decoded into the batch's
    images (`image_key` in the formatted batch); the device's failures decoded again by the
    engine."""

    def __init__(self, decode: Any, image_key: Any, engine: EnginePass, layout: Any,
                 with_index: bool):  # fmt: skip
        super().__init__(None)
        self.decode, self.image_key, self.engine = decode, image_key, engine
        self.layout, self.with_index = layout, with_index

    def apply(self, batch: Any) -> Any:
        failed = self.decode(batch[self.image_key])
        return self._decoded_on_host(batch, failed) if failed else batch

    def _decoded_on_host(self, batch: Any, failed: list[tuple[int, int, int]]) -> Any:
        """The batch with the rows the device failed on (row, sample, epoch) decoded by the
        engine on the host: their pixels, or under on_error the host's outcome for them
        (raised; left out; a substitute, every field of its row replaced)."""
        from .rows import keep_rows, replace_row, rows

        left_out = []
        for row, sample, epoch in failed:
            host: Any = self.engine.engine.decode_on_host(sample, epoch, row)
            if host is None:
                left_out.append(row)
                continue
            outputs, blobs, indices, _, _ = host
            fields = self.engine.assemble(outputs, blobs)
            replace_row(batch, self.layout.format(fields, indices, self.with_index), row)
        if left_out:
            dropped = set(left_out)
            batch = keep_rows(batch, [i for i in range(rows(batch)) if i not in dropped])
        return batch
