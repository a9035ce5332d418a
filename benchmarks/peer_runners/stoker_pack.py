"""stoker: ImageLoader over a pack made with stoker's defaults (restart markers) from the files.

--option pack=plain keeps the files byte for byte (--restart-interval 0) instead. Any other
--option names a bool ImageLoader argument: --option fast_idct=1 (0/1, false/true).
"""

from __future__ import annotations

import _common

ENV = {"venv": "main"}


def _pack_path(job):
    kind = job.options.get("pack", "default")
    return job.work / f"{job.key}.{kind}.pack"


def prepare(job):
    import stoker

    out = _pack_path(job)
    if (out / "manifest.json").exists():
        return
    listing = job.work / f"{job.key}.csv"
    listing.write_text("".join(f"{p},{label}\n" for p, label in job.files))
    options = {"restart_interval": None} if job.options.get("pack") == "plain" else {}
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
