"""decode="gpu"'s stage thread against the serial path, with sleeping stand-ins: a device decoder
that takes `--decode-ms` a batch and a training step that takes `--step-ms`, on the CPU
(device="cpu"). With the stage on a thread of its own a batch should take about
max(decode, step); on one thread it takes their sum. The figure is the time per batch against
both.

    python benchmarks/gpu_stage_overlap.py [--decode-ms 40 --step-ms 40 --batches 30]

Sleeps stand for the GPU's work (a sleeping thread holds no GIL and no core, as a thread waiting
on CUDA does not), so the figure is the design's overlap, not a machine's speed: the GPU's own
figures are benchmarks/gpu_training.py's. `--smoke` runs it tiny (CI's check that it runs).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

import stoker
from stoker.device import gpu_decode


class SleepingDecoder:
    """A device decode of a known time: a sleep (the pixels are left as they are)."""

    max_scale_denom = 8

    def __init__(self, seconds: float):
        self.seconds = seconds

    def decode_into(self, blobs, regions, targets):  # type: ignore[no-untyped-def]
        time.sleep(self.seconds)
        return [True] * len(blobs)


def per_batch(pack: Path, decode_s: float, step_s: float, batches: int, inline: bool) -> float:
    """Seconds a batch over `batches` after two of warm-up, the stage on its thread or (inline)
    run on the training thread as the serial path would."""
    from stoker.device.stage_thread import StageThread

    decoder = SleepingDecoder(decode_s)
    factory = gpu_decode.DecoderFactory(lambda device: decoder, 8)
    real_for, real_submit = gpu_decode.decoder_for, StageThread.submit

    def submit_inline(self, batch, after, work):  # type: ignore[no-untyped-def]
        from stoker.device.stage_thread import Job

        if self.stream is None:
            self.stream = self.backend.new_stream()
            self.on_start(self.backend, self.stream)
        job = Job(batch, after, work)
        job.finish(work(batch), after)
        return job

    gpu_decode.decoder_for = lambda device, batch_size=0: factory  # type: ignore[assignment]
    if inline:
        StageThread.submit = submit_inline  # type: ignore[method-assign]
    try:
        loader = stoker.ImageLoader(pack, batch_size=8, size=64, threads=1, device="cpu",
                                    dtype=torch.uint8, decode="gpu", drop_last=True)  # fmt: skip
        times, seen = [], 0
        while seen < batches + 2:
            for _ in loader:
                if seen >= 2:
                    times.append(time.perf_counter())
                time.sleep(step_s)  # the training step
                seen += 1
                if seen == batches + 2:
                    break
        loader.close()
    finally:
        gpu_decode.decoder_for = real_for  # type: ignore[assignment]
        StageThread.submit = real_submit  # type: ignore[method-assign]
    gaps = [b - a for a, b in zip(times, times[1:])]
    return statistics.median(gaps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--decode-ms", type=float, default=40.0)
    parser.add_argument("--step-ms", type=float, default=40.0)
    parser.add_argument("--batches", type=int, default=30)
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args()
    if args.smoke:
        args.batches, args.decode_ms, args.step_ms = 4, 5.0, 5.0
    torch.set_num_threads(1)  # the stand-in's render runs torch's CPU kernels on the thread
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "python"))
    from conftest import make_image_folder  # type: ignore[import-not-found]

    work = Path(tempfile.mkdtemp(prefix="stage-overlap-"))
    pack = work / "pack"
    stoker.pack(make_image_folder(work / "src", per_class=20), pack, progress=False)
    decode_s, step_s = args.decode_ms / 1e3, args.step_ms / 1e3
    # The loader's own time a batch with no decode and no step: what either way adds.
    overhead = per_batch(pack, 0.0, 0.0, args.batches, inline=False)
    rows = {}
    for name, inline in (("stage thread", False), ("serial (on the training thread)", True)):
        rows[name] = per_batch(pack, decode_s, step_s, args.batches, inline)
    print(f"decode {args.decode_ms:.0f} ms, step {args.step_ms:.0f} ms a batch; median time a "
          f"batch over {args.batches} batches, less the loader's own {1e3 * overhead:.1f} ms "
          "(no decode, no step):")  # fmt: skip
    best, worst = max(decode_s, step_s), decode_s + step_s
    for name, seconds in rows.items():
        net = seconds - overhead
        print(f"  {name}: {1e3 * seconds:.1f} ms, {1e3 * net:.1f} ms net: "
              f"{net / best:.2f}x max(decode, step), {net / worst:.2f}x their sum")  # fmt: skip

if __name__ == "__main__":
    main()
