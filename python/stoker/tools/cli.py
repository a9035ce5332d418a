"""The `stoker` command: pack, inspect, verify, bench, doctor, trace, show."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Iterator

from ..packing.sources import FORMATS as SOURCE_FORMATS


def _cmd_pack(args) -> int:
    from ..errors import InvalidArgumentError
    from ..packing import pack

    if args.coco and args.images is None:
        raise InvalidArgumentError("--coco needs --images DIR (the folder of its image files)")
    if args.tasks is not None and args.ray is None:
        raise InvalidArgumentError("--tasks goes with --ray ADDRESS")
    members = None
    if args.member:
        members = {}
        for item in args.member:
            name, sep, column = item.partition("=")
            if not sep or not name or not column:
                raise InvalidArgumentError(f"--member takes NAME=COLUMN (jpg=image), not {item!r}")
            members[name] = column
    result = pack(
        args.src,
        args.out,
        format=args.format,
        members=members,
        label=args.label,
        allow_pickle=args.allow_pickle,
        compression=args.compression,
        image_codec=args.image_codec,
        on_error=args.on_error,
        resume=not args.no_resume,
        images=args.images,
        max_side=args.max_side,
        shard_size=args.shard_size,
        quality=args.quality,
        restart_interval=args.restart_interval,
        threads=args.threads,
        overwrite=args.overwrite,
        progress=not args.quiet,
        engine="local" if args.ray is None else "ray",
        ray_address=args.ray or None,
        codec=args.codec,
        size=None if args.size is None else tuple(args.size),
        video_keyint=args.video_keyint,
        video_remux=args.video_remux,
        audio_rate=args.audio_rate,
        audio_channels=args.audio_channels,
        tasks=args.tasks,
    )
    print(result)
    return 0


def _cmd_inspect(args) -> int:
    from ..packing import inspect

    info = inspect(args.pack)
    if args.json:
        print(json.dumps(info, indent=1))
        return 0
    print(f"format      {info['format']} (version {info['version']})")
    print(f"samples     {info['num_samples']}")
    if info.get("source_format"):
        print(f"packed from {info['source_format']}")
    print(f"shards      {info['shards']}")
    if info.get("bytes") is not None:
        print(
            f"bytes       {info['bytes']:,} "
            f"({info['bytes'] / max(info['num_samples'], 1) / 1e3:.1f} kB/sample)"
        )
    if info.get("codec") == "jpeg":
        print(f"codec       jpeg: every image re-encoded at quality {info['quality']} (lossy)")
    elif info.get("codec") == "raw":
        print("codec       raw: decoded pixels")
    if info.get("max_side"):
        shrunk = f", shrunk ones re-encoded at quality {info['quality']}" if info.get(
            "quality") and info.get("codec") == "source" else ""  # fmt: skip
        print(f"max_side    {info['max_side']}{shrunk}")
    if info.get("video_keyint"):
        print(f"videos      H.264, re-encoded with a keyframe every {info['video_keyint']} frames")
    if info.get("video_remux"):
        print("videos      without an index copied into MP4 (not re-encoded)")
    v = info.get("videos")
    if v and "unavailable" in v:
        print(f"videos      facts unavailable: {v['unavailable']}")
    elif v:
        s = v["seconds"]
        print(f"videos      {v['videos']:,} ({v['total_seconds'] / 3600:.2f} h, {v['frames']:,} "
              f"frames), {v['variable_rate']:,} of variable frame rate")
        print(f"  seconds   min {s['min']}, p10 {s['p10']}, median {s['median']}, "
              f"p90 {s['p90']}, max {s['max']}")
        print("  fps       " + ", ".join(f"{r} ({n:,})" for r, n in v["fps"]))
        print("  sizes     " + ", ".join(f"{w}x{h} ({n:,})" for (h, w), n in v["sizes"]))
        print("  codecs    " + ", ".join(f"{c} ({n:,})" for c, n in v["codecs"].items()))
        if v["keyframe_gap_median_seconds"] is not None:
            print(f"  keyframes every {v['keyframe_gap_median_seconds']} s (median)")
        if v["unreadable"]:
            print(f"  {v['unreadable']:,} videos do not open (stoker.video_facts lists them)")
    for a in info.get("attached") or []:
        print(f"attached    {a['name']}: {a['samples']:,} values, {a['bytes']:,} bytes "
              f"(fingerprint {a['fingerprint']})")
    if info.get("audio_rate"):
        mono = ", mono" if info.get("audio_channels") == 1 else ""
        print(f"sounds      16-bit PCM at {info['audio_rate']} Hz{mono}, resampled with soxr")
    if info.get("num_tokens") is not None:
        print(f"tokens      {info['num_tokens']:,} {info['dtype']} (eos_id {info['eos_id']})")
    if info["format"] == "stoker-arrays":
        for f in info["fields"]:
            shape = str(tuple(f["shape"]))
            print(f"field       {f['name']:<20} {f['dtype']:<8} {shape}")
    classes = info.get("classes") or []
    counts = info.get("class_counts") or [None] * len(classes)
    print(f"classes     {len(classes)}")
    for name, count in list(zip(classes, counts, strict=True))[: args.max_classes]:
        print(f"  {name:<30} {count if count is not None else ''}")
    if len(classes) > args.max_classes:
        print(f"  ... {len(classes) - args.max_classes} more (--max-classes)")
    if info.get("failed"):
        print(
            f"failed      {info['failed']} source file(s) could not be packed (see manifest.json)"
        )
    if info.get("aspects"):
        from .aspects import text

        print("\n".join(text(info["aspects"])))
    if args.html:
        from .aspects import write_html

        print(f"page: {write_html(info, args.html)}")
    return 0


def _cmd_verify(args) -> int:
    """Exit status: 0 clean, 1 some samples failed, 2 the pack could not be opened."""
    from ..errors import StokerError
    from ..load.quarantine import make_report
    from .verify import format_failure, verify

    try:
        result = verify(
            args.pack,
            threads=args.threads,
            decode=not args.no_decode,
            report=args.report,
            progress=not args.quiet,
            allow_warnings=args.allow_warnings,
        )
    except (StokerError, OSError) as e:
        print(f"stoker verify: {e}", file=sys.stderr)
        return 2
    if args.json:
        out = make_report(
            source=result.path,
            kind="verify",
            checked=result.checked,
            failures=[f.as_dict() for f in result.failures],
        )
        out.update(
            samples=result.samples,
            bytes=result.bytes,
            seconds=round(result.seconds, 3),
            crc_checked=result.crc_checked,
            decoded=result.decoded,
        )
        print(json.dumps(out, indent=1))
    else:
        print(result.summary())
        shown = result.failures[: args.max_failures]
        for f in shown:
            print(format_failure(f))
        if len(result.failures) > len(shown):
            rest = len(result.failures) - len(shown)
            where = f"see {args.report}" if args.report else "see --report"
            print(f"  ... {rest} more, {where}")
        if args.report:
            print(f"report written to {args.report}")
    return 0 if result.clean else 1


def _cmd_bench(args) -> int:
    from . import bench
    from ..machine import usable_cores

    threads = args.threads or usable_cores()
    train = not args.eval
    print(
        f"pipeline: {'RandomResizedCrop+flip' if train else 'Resize+CenterCrop'} {args.size}, "
        f"batch {args.batch_size}, {threads} thread(s), median of {args.epochs} epochs"
    )
    run = bench.stoker_epoch(
        args.pack, batch_size=args.batch_size, size=args.size, train=train, threads=threads
    )
    mine = bench.time_epochs("stoker", run, epochs=args.epochs)
    print(mine)
    stats = run.loader.stats()
    secs = stats["seconds"]
    work = sum(secs[k] for k in ("read", "decode", "transform", "collate")) or 1.0
    print(
        "  stage share: "
        + ", ".join(
            f"{k} {100 * secs[k] / work:.0f}%" for k in ("read", "decode", "transform", "collate")
        )
    )
    if args.vs_dataloader:
        transform = bench.TorchvisionTransform(args.size, train)
        dataset = bench.PackDataset(args.pack, transform)
        best = None
        for workers in args.workers:
            m = bench.time_epochs(
                f"DataLoader num_workers={workers}",
                bench.dataloader_epoch(dataset, batch_size=args.batch_size, workers=workers),
                epochs=args.epochs,
            )
            print(m)
            best = m if best is None or m.images_per_s > best.images_per_s else best
        assert best is not None, "--workers has at least one value"
        print(
            f"stoker / best DataLoader ({best.name}): {mine.images_per_s / best.images_per_s:.2f}x"
        )
    return 0


def _cmd_doctor(args) -> int:
    import torch

    from ..doctor import builtin_step, diagnose
    from ..load.loader import ImageLoader

    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    threads = args.threads if args.threads == "auto" else int(args.threads)
    loader = ImageLoader(
        args.pack,
        batch_size=args.batch_size,
        size=args.size,
        train=not args.eval,
        threads=threads,
        device=device if device != "cpu" else None,
        dtype=torch.bfloat16 if device != "cpu" else None,
        mean=(0.485, 0.456, 0.406) if device != "cpu" else None,
        std=(0.229, 0.224, 0.225) if device != "cpu" else None,
    )
    model = args.model if args.model != "auto" else ("tiny" if device == "cpu" else "small")
    step = builtin_step(model, max(2, len(loader.classes)), device)
    print(
        f"stoker doctor: {args.pack}, batch {args.batch_size}, size {args.size}, "
        f"model {model} on {device}; {args.warmup} + {args.steps} batches a phase",
        file=sys.stderr,
    )
    try:
        diagnosis = diagnose(loader, step, steps=args.steps, warmup=args.warmup, device=device)
    finally:
        loader.close()
    print(diagnosis)
    if args.html:
        print(f"report: {diagnosis.to_html(args.html)}")
    return 0


@contextlib.contextmanager
def _ranks_in_environment(args) -> Iterator[None]:
    """``--rank``/``--world-size`` as RANK and WORLD_SIZE, where a loader without explicit ranks
    reads them (whenever it resolves its ranks), for the command's duration."""
    from ..errors import InvalidArgumentError

    if args.world_size is None:
        if args.rank:
            raise InvalidArgumentError("--rank goes with --world-size")
        yield
        return
    saved = {k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE")}
    os.environ.update(WORLD_SIZE=str(args.world_size), RANK=str(args.rank or 0))
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _replayed_loader(args) -> object:
    """The loader `trace` and `show` replay: the user's own (``--loader FILE.py:FUNCTION``, called
    with no arguments), or one built from the flags: an ImageLoader, or for a pack of videos or
    sounds a Loader of its Video or Audio member (with the label)."""
    import importlib.util

    from ..errors import InvalidArgumentError
    from ..load.fields import Audio, Label, Video
    from ..load.loader import ImageLoader, Loader
    from ..packing.inspection import inspect

    if args.loader is None:
        if args.pack is None:
            raise InvalidArgumentError("give a PACK, or --loader FILE.py:FUNCTION")
        kinds = {f["name"]: f["kind"] for f in inspect(args.pack).get("fields", [])}
        media = [(n, k) for n, k in kinds.items() if k in ("video", "audio")]
        if media and "image" not in kinds.values():
            kind = media[0][1]
            name = ";".join(n for n, k in media if k == kind)  # each sample has one of them
            field = Video(name, size=args.size) if kind == "video" else Audio(name, seconds=4.0)
            fields = {kind: field, **({"label": Label()} if "cls" in kinds else {})}
            return Loader(args.pack, batch_size=args.batch_size, fields=fields,
                          train=not args.eval, seed=args.seed, threads=1)  # fmt: skip
        return ImageLoader(args.pack, batch_size=args.batch_size, size=args.size,
                           train=not args.eval, seed=args.seed, threads=1)  # fmt: skip
    file, sep, function = args.loader.rpartition(":")
    if not sep or not file.endswith(".py") or not os.path.isfile(file):
        raise InvalidArgumentError(
            f"--loader takes FILE.py:FUNCTION (a function returning the training loader), "
            f"not {args.loader!r}"
        )
    # Imported as `python FILE` would run it: its folder on sys.path (for its own imports), the
    # module in sys.modules under its name (for dataclasses, pickling).
    name = os.path.splitext(os.path.basename(file))[0]
    sys.path.insert(0, os.path.dirname(os.path.abspath(file)))
    spec = importlib.util.spec_from_file_location(name, file)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    if not callable(getattr(module, function, None)):
        raise InvalidArgumentError(f"{file} has no function {function!r}")
    return getattr(module, function)()


def _cmd_trace(args) -> int:
    from ..load.mix import Mix

    rank = None if args.world_size is None or args.all_ranks else args.rank or 0
    with _ranks_in_environment(args):
        loader = _replayed_loader(args)
        try:
            ids = loader.sample_ids(args.epoch, args.step, rank)  # type: ignore[attr-defined]
        finally:
            loader.close()  # type: ignore[attr-defined]
    if args.json:
        print(json.dumps(ids, indent=1))
        return 0
    source = ""
    if isinstance(loader, Mix):
        source = f"source {ids['source']}: "
        ids = ids["samples"]
    by_rank = ids if isinstance(ids, dict) else {rank: ids}
    print(f"{source}epoch {args.epoch}, step {args.step}")
    print(f"{'rank':>4}  {'pos':>4}  {'index':>9}  {'shard':<24}  key")
    for r, samples in sorted(by_rank.items()):
        for position, sample in enumerate(samples):
            print(f"{r:>4}  {position:>4}  {sample['index']:>9}  {sample['shard']:<24}  "
                  f"{sample['key']}")  # fmt: skip
    return 0


def _cmd_show(args) -> int:
    from .replay import show

    with _ranks_in_environment(args):
        loader = _replayed_loader(args)
        try:
            print(show(loader, args.epoch, args.step, args.html, columns=args.columns))
        finally:
            loader.close()  # type: ignore[attr-defined]
    return 0


def _replay_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("pack", nargs="?", help="the pack (not needed with --loader)")
    p.add_argument("--epoch", type=int, default=0)
    p.add_argument(
        "--step", type=int, required=True, help="the step, counted from the epoch's start"
    )
    p.add_argument("--rank", type=int, default=None, help="with --world-size (default 0)")
    p.add_argument("--world-size", type=int, default=None, help="the job's ranks (default 1)")
    p.add_argument(
        "--loader",
        metavar="FILE.py:FUNCTION",
        help="replay your own loader: FUNCTION() in FILE returns it as training builds it "
        "(fields, augment=, seed, batch size); without it, an ImageLoader from the flags below",
    )
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--eval", action="store_true", help="Resize+CenterCrop instead of crops")


def build_parser() -> argparse.ArgumentParser:
    """The `stoker` command's parser, every subcommand with its options (the docs site's command
    line reference prints each one's --help from it)."""
    parser = argparse.ArgumentParser(prog="stoker", description="Feed PyTorch training fast.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser(
        "pack",
        help="pack a dataset into shards: image folders, tables, COCO, WebDataset, Parquet and "
        "Hugging Face datasets, LMDB, TFRecord, HDF5, .pt files",
    )
    p.add_argument(
        "src",
        help="ImageFolder directory; .csv (path,label, or a header naming members: jpg, "
        "seg.png, cls, json, txt, ...) or .jsonl table; COCO instances .json (with --images); "
        ".tar shards (file, folder or glob); Parquet file or folder, a Hugging Face "
        "save_to_disk folder; LMDB folder; TFRecord file(s); HDF5 file; .pt/.pth file",
    )
    p.add_argument("out")
    p.add_argument(
        "--format",
        default=None,
        choices=sorted(SOURCE_FORMATS),
        help="the source's format, where it is not found from the path",
    )
    p.add_argument(
        "--member",
        action="append",
        metavar="NAME=COLUMN",
        help="store the source's COLUMN (feature, dataset, key) as member NAME, whose extension "
        "says what it becomes: jpg (image), seg.png (mask), feat.npy (array), txt, json; "
        "repeat for each member (default: the format's own conventions)",
    )
    p.add_argument(
        "--label",
        default=None,
        metavar="KEY",
        help="the label's column (feature, dataset); for LMDB a .json file of key -> label",
    )
    p.add_argument(
        "--on-error",
        choices=("skip", "raise"),
        default="skip",
        help="skip: list a record that cannot be packed and go on (default); raise: stop there",
    )
    p.add_argument(
        "--no-resume",
        action="store_true",
        help="start over instead of resuming an interrupted pack of the same source",
    )
    p.add_argument(
        "--compression",
        choices=("gzip", "zlib", "none"),
        default=None,
        help="TFRecord compression (default: found from the files)",
    )
    p.add_argument(
        "--image-codec",
        choices=("png", "jpeg"),
        default="png",
        help="how pixels (not encoded files) are stored: png (lossless, default) or jpeg",
    )
    p.add_argument(
        "--allow-pickle",
        action="store_true",
        help="unpickle pickled LMDB values (runs code the data names: trusted data only)",
    )
    p.add_argument(
        "--coco",
        action="store_true",
        help="SRC is a COCO instances .json: each image packed with its boxes (json) and a "
        "class mask (seg.png); usage: stoker pack --coco ANN.json --images DIR OUT",
    )
    p.add_argument("--images", metavar="DIR", help="the folder of the COCO images' file_name")
    p.add_argument(
        "--max-side",
        type=int,
        default=None,
        help="shrink images whose longer side exceeds this, once, at pack time",
    )
    p.add_argument(
        "--codec",
        choices=("source", "raw", "jpeg"),
        default="source",
        help="source: the image files (default); raw: their decoded pixels (binary PPM), read "
        "with no decoding: more disk, no decode CPU; jpeg: every image re-encoded as a JPEG at "
        "--quality (lossy; with --max-side 512 --quality 90, FFCV's recipe)",
    )
    p.add_argument(
        "--size",
        type=int,
        nargs=2,
        metavar=("H", "W"),
        default=None,
        help="with --codec raw: store every image at H x W",
    )
    p.add_argument(
        "--video-keyint",
        type=int,
        default=None,
        metavar="K",
        help="re-encode videos (ffmpeg, H.264) with a keyframe every K frames, shrunk to "
        "--max-side if given, so that a clip decodes at most K - 1 frames before its own",
    )
    p.add_argument(
        "--video-remux",
        action="store_true",
        help="copy videos in a container without an index (MPEG-PS/TS, AVI) into MP4 without "
        "re-encoding: the same frames, found without parsing the whole file on every read",
    )
    p.add_argument(
        "--audio-rate",
        type=int,
        default=None,
        metavar="HZ",
        help="decode sounds once and store them as 16-bit PCM WAV at HZ (soxr): an Audio field "
        "at that rate reads windows instead of decoding and resampling them every epoch",
    )
    p.add_argument(
        "--audio-channels",
        type=int,
        choices=(1,),
        default=None,
        help="with --audio-rate: 1 stores the mean of each sound's channels",
    )
    p.add_argument("--shard-size", default="256MB")
    p.add_argument(
        "--quality",
        type=int,
        default=90,
        help="JPEG quality of re-encoded images (--codec jpeg, or shrunk by --max-side)",
    )
    p.add_argument(
        "--restart-interval",
        type=int,
        default=1,
        metavar="MCUS",
        help="rewrite baseline JPEGs losslessly with restart markers every MCUS MCUs "
        "so that crops decode only what they cover (default 1; 0 keeps the "
        "files byte for byte)",
    )
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="preparing threads (default: the CPUs; with --ray, per task, default 1)",
    )
    p.add_argument(
        "--ray",
        metavar="ADDRESS",
        default=None,
        help="pack on a Ray cluster: HOST:PORT of its head, 'auto' (the cluster on this "
        "machine) or 'local' (start one here); every node must see SRC and OUT at the same "
        "paths. Needs pip install 'stoker[ray]'",
    )
    p.add_argument(
        "--tasks",
        type=int,
        default=None,
        metavar="N",
        help="with --ray: split the samples into N tasks (default: the cluster's CPUs / threads)",
    )
    p.add_argument("--overwrite", action="store_true")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_cmd_pack)

    p = sub.add_parser("inspect", help="what a pack holds")
    p.add_argument("pack")
    p.add_argument("--json", action="store_true")
    p.add_argument("--max-classes", type=int, default=20)
    p.add_argument("--html", metavar="PATH", help="also write a page with the aspect histogram")
    p.set_defaults(func=_cmd_inspect)

    p = sub.add_parser(
        "verify",
        help="check every sample: CRC32C and a full decode (exit 0 clean, 1 failures, "
        "2 cannot open)",
    )
    p.add_argument("pack", help="pack folder, .tar, folder of .tar shards, or a glob")
    p.add_argument("--threads", type=int, default=None, help="default: the CPU count")
    p.add_argument("--no-decode", action="store_true", help="CRC32C (and readability) only")
    p.add_argument("--report", default=None, metavar="PATH", help="write a JSON report here")
    p.add_argument(
        "--allow-warnings",
        action="store_true",
        help="pass JPEGs that libjpeg decodes only with warnings (truncated, damaged data)",
    )
    p.add_argument("--max-failures", type=int, default=20, help="failures to print (default 20)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=_cmd_verify)

    p = sub.add_parser("bench", help="throughput of a pack's pipeline")
    p.add_argument("pack")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--size", type=int, default=224)
    p.add_argument(
        "--eval", action="store_true", help="Resize+CenterCrop instead of training crops"
    )
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument(
        "--vs-dataloader",
        action="store_true",
        help="also time torch's DataLoader on the same files, in the same run",
    )
    p.add_argument(
        "--workers",
        type=lambda s: [int(x) for x in s.split(",")],
        default=[0, 1, 2, 3, 4],
        help="DataLoader num_workers values to try (default 0,1,2,3,4)",
    )
    p.set_defaults(func=_cmd_bench)

    p = sub.add_parser(
        "doctor",
        help="what bounds training on a pack (data, compute, transfer), with a built-in model",
    )
    p.add_argument("pack")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--eval", action="store_true", help="Resize+CenterCrop instead of crops")
    p.add_argument("--threads", default="auto", help="stoker's threads: 'auto' or a number")
    p.add_argument(
        "--model", choices=["auto", "tiny", "small"], default="auto",
        help="the built-in model: 'tiny' (3 conv layers) or 'small' (8, ResNet-18's widths); "
        "auto: small on a GPU, tiny on the CPU (where small takes seconds a step)",
    )  # fmt: skip
    p.add_argument("--device", default="auto", help="'cuda', 'cpu' or 'auto'")
    p.add_argument("--steps", type=int, default=20, help="batches per phase, after warm-up")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--html", metavar="PATH", help="also write an HTML report with plots")
    p.set_defaults(func=_cmd_doctor)

    p = sub.add_parser(
        "trace", help="which samples a step handed each rank (computed: nothing is read)"
    )
    _replay_arguments(p)
    p.add_argument("--all-ranks", action="store_true", help="every rank's samples")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_cmd_trace)

    p = sub.add_parser(
        "show",
        help="draw a step's batch as the model saw it (after crops, flips and augmentation), "
        "with keys and labels, the ops and magnitudes its augment= policies drew, boxes and "
        "masks: an HTML contact sheet",
    )
    _replay_arguments(p)
    p.add_argument("--html", required=True, metavar="PATH", help="where to write the page")
    p.add_argument("--columns", type=int, default=8)
    p.set_defaults(func=_cmd_show)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from ..errors import StokerError

    try:
        return args.func(args)
    except StokerError as e:
        print(f"stoker {args.command}: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
