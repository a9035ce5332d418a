"""MkDocs hook (mkdocs.yml): the docs site's pages that are made from other sources.

- index.md is README.md, its links into docs/ made relative to the site, its links to other
  files of the repository (examples, the Makefile) shown as their paths;
- CONTRIBUTING.md and CHANGELOG.md are the repository's own, likewise;
- reference/api.md documents every name of ``stoker.__all__`` (mkdocstrings, from the
  docstrings), grouped: a name in ``stoker.__all__`` that no group lists fails the build, as does
  a group naming something that is not public;
- reference/augment.md documents ``stoker.augment.__all__`` the same way;
- reference/cli.md is the ``stoker`` command's ``--help`` and each subcommand's.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any

from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[2]

# The Python API's pages, in reading order: a heading, a sentence, the names.
API_GROUPS: list[tuple[str, str, list[str]]] = [
    ("Loaders", "What a training loop iterates over.",
     ["ImageLoader", "Loader", "TokenLoader", "PackedTokenLoader", "mix", "Mix", "RayWorkers"]),
    ("Fields", "What each member of a sample becomes in `Loader(fields=...)`.",
     ["Image", "Mask", "Boxes", "Label", "Array", "Bytes", "Text", "Json", "Tokens", "Video",
      "Audio"]),
    ("Geometries", "How an Image field is cropped and resized.",
     ["RandomResizedCrop", "CenterCrop", "Resize", "Letterbox", "RandomCrop", "CoverCrop",
      "AspectBuckets", "VideoBuckets"]),
    ("Packing and checking", "Making packs, and reading what is in them.",
     ["pack", "pack_arrays", "pack_tokens", "pack_text", "inspect", "video_facts", "VideoFacts",
      "attach", "AttachResult",
      "PackResult", "verify",
      "VerifyReport"]),
    ("On the GPU", "Batches on the device, converted and normalised there.",
     ["to_device", "DeviceFeed", "IMAGENET_MEAN", "IMAGENET_STD"]),
    ("Diagnosis", "What bounds a training job, measured.",
     ["diagnose", "watch", "Diagnosis", "Recommendation", "sweep", "SweepResult"]),
    ("Replay", "A step's samples, batch and augmentation draws, again.",
     ["show", "read_record", "augment_draws"]),
    ("Errors and warnings", "Every error names the shard, key and reason.",
     ["StokerError", "CorruptDataError", "UnsupportedFormatError", "ShardIOError",
      "ResourceLimitError", "InvalidArgumentError", "StepOutOfRangeError", "StokerInternalError",
      "ErrorBudgetExceededError", "DeviceUnavailableError", "StokerWarning"]),
]  # fmt: skip

# Names whose objects do not say where they are defined (constants): their module.
CONSTANT_MODULES = {"IMAGENET_MEAN": "stoker.device", "IMAGENET_STD": "stoker.device"}


def _identifier(module: Any, name: str) -> str:
    """The path mkdocstrings finds `name` of `module` under: where it is defined."""
    if name in CONSTANT_MODULES:
        return f"{CONSTANT_MODULES[name]}.{name}"
    obj = getattr(module, name)
    if isinstance(obj, type(module)):  # a submodule
        return obj.__name__
    defined = getattr(obj, "__module__", None)
    qualname = getattr(obj, "__qualname__", None)
    if not defined or not qualname:
        raise PluginError(f"{module.__name__}.{name}: cannot tell where it is defined")
    return f"{defined}.{qualname}"


def api_page() -> str:
    import stoker

    public = set(stoker.__all__)
    grouped = [n for _, _, names in API_GROUPS for n in names]
    missing = sorted(public - set(grouped))
    extra = sorted(set(grouped) - public)
    if missing or extra:
        raise PluginError(
            f"docs/_hooks/site.py API_GROUPS: public names without a group {missing}, "
            f"names that are not in stoker.__all__ {extra}"
        )
    lines = [
        "# Python API",
        "",
        "Every name `import stoker` gives (`stoker.__all__`), generated from the docstrings. "
        "The augmentations are on [their own page](augment.md), the command line on "
        "[its own](cli.md).",
        "",
    ]
    for title, sentence, names in API_GROUPS:
        lines += [f"## {title}", "", sentence, ""]
        for name in names:
            lines += [f"::: {_identifier(stoker, name)}", "    options:", f"      heading: {name}",
                      ""]  # fmt: skip
    return "\n".join(lines)


def augment_page() -> str:
    import stoker.augment as augment

    lines = [
        "# stoker.augment",
        "",
        "Batch augmentations: each sample's parameters drawn from (seed, epoch, sample), the "
        "same on the host's worker threads and on the batch's device. "
        "[Augmentation](../AUGMENT.md) says how they run and what they cost.",
        "",
    ]
    modules = [n for n in augment.__all__ if isinstance(getattr(augment, n), type(augment))]
    for name in [n for n in augment.__all__ if n not in modules]:
        lines += [f"::: {_identifier(augment, name)}", "    options:", f"      heading: {name}", ""]
    for name in modules:
        lines += [f"## stoker.augment.{name}", "", f"::: stoker.augment.{name}", "    options:",
                  "      show_root_heading: false", "      heading_level: 3", ""]  # fmt: skip
    return "\n".join(lines)


def cli_page() -> str:
    from stoker.tools.cli import build_parser

    parser = build_parser()
    lines = [
        "# Command line",
        "",
        "`stoker COMMAND --help` prints each of these; the options are the Python API's "
        "([Python API](api.md)).",
        "",
        "```text",
        parser.format_help().rstrip(),
        "```",
        "",
    ]
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, command in sub.choices.items():
        lines += [f"## stoker {name}", "", "```text", command.format_help().rstrip(), "```", ""]
    return "\n".join(lines)


def _site_links(text: str) -> str:
    """README.md's and the root files' links, for a page at the site's top: docs/X -> X; a link
    to a file outside docs/ (examples, the Makefile) becomes the path in code."""

    def fix(m: re.Match[str]) -> str:
        label, target = m.group(1), m.group(2)
        if re.match(r"[a-z]+://|#|mailto:", target):
            return m.group(0)
        if target.startswith("docs/"):
            return f"[{label}]({target[5:]})"
        if target in ("CONTRIBUTING.md", "CHANGELOG.md"):
            return m.group(0)
        return label if label.startswith("`") else f"{label} (`{target}`)"

    return re.sub(r"(?<!!)\[([^\]]+)\]\(([^)\s]+)\)", fix, text).replace("](docs/", "](")


def _generated(config: Any, path: str, content: str) -> File:
    return File.generated(config, path, content=content)


def on_files(files: Files, config: Any) -> Files:
    readme = (ROOT / "README.md").read_text()
    files.append(_generated(config, "index.md", _site_links(readme)))
    for name in ("CONTRIBUTING.md", "CHANGELOG.md"):
        files.append(_generated(config, name, _site_links((ROOT / name).read_text())))
    files.append(_generated(config, "reference/api.md", api_page()))
    files.append(_generated(config, "reference/augment.md", augment_page()))
    files.append(_generated(config, "reference/cli.md", cli_page()))
    return files
