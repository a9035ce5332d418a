"""make wheels' last step: every file it made in dist/ carries stoker's LICENSE (Apache-2.0),
and every wheel the decoders' licences beside it and one extension per kind for its tag.

    check_dist.py DIST_FILE..."""

from __future__ import annotations

import sys
import tarfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def check(path: Path, license_text: bytes) -> str:
    if path.name.endswith(".tar.gz"):
        with tarfile.open(path) as tar:
            names = tar.getnames()
            top = [n for n in names if n.count("/") == 1 and n.endswith("/LICENSE")]
            assert top, f"{path.name}: no LICENSE at the top of the sdist"
            member = tar.extractfile(top[0])
            assert member is not None and member.read() == license_text, f"{path.name}: LICENSE"
        return f"{path.name}: LICENSE"
    with zipfile.ZipFile(path) as wheel:
        names = wheel.namelist()
        licences = [n for n in names if ".dist-info/licenses/" in n and n.endswith("LICENSE")]
        assert licences, f"{path.name}: no .dist-info/licenses/LICENSE"
        assert wheel.read(licences[0]) == license_text, f"{path.name}: {licences[0]} differs"
        vendored = [n for n in names if n.startswith("stoker/_vendor_licenses/")]
        assert "stoker/_vendor_licenses/README.txt" in vendored, f"{path.name}: {vendored}"
        assert len(vendored) >= 4, f"{path.name}: the decoders' licences: {vendored}"
        abi3 = "-abi3-" in path.name
        cores = [n for n in names if n.startswith("stoker/_core.") and n.endswith(".so")]
        assert len(cores) == 1 and (".abi3.so" in cores[0]) == abi3, f"{path.name}: {cores}"
        metadata = wheel.read(next(n for n in names if n.endswith(".dist-info/METADATA")))
        assert b"License-Expression: Apache-2.0" in metadata, f"{path.name}: METADATA"
    return f"{path.name}: LICENSE, {len(vendored) - 1} decoder licences, {cores[0]}"


def main(paths: list[str]) -> None:
    assert paths, "no files given"
    license_text = (ROOT / "LICENSE").read_bytes()
    assert b"Apache License" in license_text and b"Version 2.0" in license_text
    for p in paths:
        print("make wheels:", check(Path(p), license_text))


if __name__ == "__main__":
    main(sys.argv[1:])
