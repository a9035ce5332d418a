"""stoker: ImageLoader over a pack made with stoker's defaults (restart markers) from the files.

--option pack=KIND packs them otherwise:
    plain      the files byte for byte (--restart-interval 0)
    max512     images whose longer side exceeds 512 shrunk to 512 and re-encoded at quality 90,
               the others kept (--max-side 512): like for like with FFCV on large photos
    ffcv       every image re-encoded at quality 90, the longer side at most 512 (--codec jpeg
               --max-side 512 --quality 90): FFCV's recipe, its .beton's content
Any other --option names a bool ImageLoader argument: --option fast_idct=1 (0/1, false/true).
"""

from __future__ import annotations

import _common

ENV = {"venv": "main"}
PACKS = {
    "default": {},
    "plain": {"restart_interval": None},
    "max512": {"max_side": 512, "quality": 90},
    "ffcv": {"codec": "jpeg", "max_side": 512, "quality": 90},
}


def _pack_path(job):
    kind = job.options.get("pack", "default")
    if kind not in PACKS:
        raise SystemExit(f"--option pack={kind}: one of {', '.join(PACKS)}")
    return job.work / f"{job.key}.{kind}.pack"


def prepare(job):
    import stoker

    out = _pack_path(job)
    if (out / "manifest.json").exists():
        return
    listing = job.work / f"{job.key}.csv"
    listing.write_text("".join(f"{p},{label}\n" for p, label in job.files))
    options = PACKS[job.options.get("pack", "default")]
    stoker.pack(listing, out, overwrite=True, progress=False, **options)


def _loader_options(job):
    values = {"1": True, "true": True, "0": False, "false": False}
    options = {}
    for key, value in job.options.items():
        if key == "pack":
            continue
        if value.lower() not in values:
            raise SystemExit(f"--option {key}={value}: 0, 1, false or true")
        options[key] = values[value.lower()]
    return options


def make_epoch(job):
    import stoker

    loader = stoker.ImageLoader(
        str(_pack_path(job)),
        batch_size=job.batch_size,
        size=job.size,
        train=job.train,
        threads=job.threads,
        **_loader_options(job),
    )
    return lambda: iter(loader)


def version():
    import stoker

    return f"stoker {stoker.__version__}"


if __name__ == "__main__":
    raise SystemExit(_common.main("stoker", make_epoch, version=version, prepare=prepare))
