"""The shipped type stubs of the extension (python/stoker/_core.pyi) are nanobind's stubgen
output for the installed build, byte for byte: a binding changed without `make stubs` fails here.
stubgen's output depends on nanobind's version, which the Makefile pins (PY_PACKAGES)."""

import difflib
import subprocess
import sys
from pathlib import Path

import stoker

PACKAGE = Path(__file__).resolve().parents[2] / "python" / "stoker"


def test_core_stub_is_stubgen_output(tmp_path):
    generated = tmp_path / "_core.pyi"
    # -P: members with a trailing underscore too (ErrorPolicy.raise_), not only private ones.
    stubgen = [sys.executable, "-m", "nanobind.stubgen", "-q", "-P", "-m", "stoker._core"]
    subprocess.run([*stubgen, "-o", str(generated)], check=True)
    committed = (PACKAGE / "_core.pyi").read_text()
    new = generated.read_text()
    diff = "".join(
        difflib.unified_diff(
            committed.splitlines(keepends=True),
            new.splitlines(keepends=True),
            "python/stoker/_core.pyi (committed)",
            "stubgen of the installed stoker._core",
        )
    )
    assert new == committed, f"the bindings changed: run `make stubs` and commit the stub\n{diff}"


def test_installed_package_is_typed():
    # PEP 561: without py.typed a type checker ignores the installed package's annotations, and
    # without the stub it sees the extension as Any.
    installed = Path(stoker.__file__).parent
    for name in ("py.typed", "_core.pyi"):
        assert (PACKAGE / name).is_file()
        assert (installed / name).is_file(), f"{name} is not in the installed package ({installed})"
