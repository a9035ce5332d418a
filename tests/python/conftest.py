import io
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "data"


def write_tar(path: Path, members: list[tuple[str, str, bytes, int]]) -> Path:
    """A WebDataset shard: each (key, extension, bytes, label) as key.ext and key.cls."""
    with tarfile.open(path, "w") as tar:
        for key, ext, data, label in members:
            for name, payload in ((f"{key}.{ext}", data), (f"{key}.cls", str(label).encode())):
                info = tarfile.TarInfo(name)
                info.size = len(payload)
                tar.addfile(info, io.BytesIO(payload))
    return path


def after_passes(loader, marks: tuple[int, ...], read) -> dict[int, object]:
    """`read()` once the loader has given `mark` batches, for each of `marks`, taken at the end
    of the first whole pass that gets there: with a decode="gpu" stage idle (its thread stopped,
    its stream's work done, its ring freed), never while a pass holds buffers sized by its
    largest batch so far. The GPU memory test reads device memory so; its CPU form reads what
    the stage holds."""
    seen, at = 0, {}
    while len(at) < len(marks):
        for _ in loader:  # whole passes
            seen += 1
        for mark in marks:
            if seen >= mark and mark not in at:
                at[mark] = read()
    return at


def make_image_folder(root: Path, classes=("cat", "dog", "eel"), per_class=12, seed=0) -> Path:
    """A small ImageFolder tree: varied sizes, a progressive JPEG, a PNG and a grayscale file."""
    rng = np.random.default_rng(seed)
    for c, name in enumerate(classes):
        d = root / name
        d.mkdir(parents=True)
        for i in range(per_class):
            w, h = int(rng.integers(60, 400)), int(rng.integers(60, 400))
            yy, xx = np.mgrid[0:h, 0:w]
            base = np.stack([(xx * (c + 1)) % 256, (yy * 2) % 256, (xx + yy + 40 * c) % 256], -1)
            noise = rng.integers(0, 30, size=(h, w, 3))
            img = Image.fromarray((base + noise).clip(0, 255).astype(np.uint8))
            if i == 3:
                img.save(d / f"img{i:03d}.png")
            elif i == 4:
                img.convert("L").save(d / f"img{i:03d}.jpg", quality=90)
            else:
                img.save(d / f"img{i:03d}.jpg", quality=90, progressive=(i == 5))
    return root


@pytest.fixture(scope="session")
def image_folder(tmp_path_factory) -> Path:
    return make_image_folder(tmp_path_factory.mktemp("folder") / "train")


@pytest.fixture(scope="session")
def packed(image_folder, tmp_path_factory) -> Path:
    import stoker

    out = tmp_path_factory.mktemp("pack") / "train"
    stoker.pack(image_folder, out, shard_size="128KB", progress=False)
    return out


def corrupt(pack, indices) -> set[str]:
    """Cut the JPEG data of these samples short in place; their keys."""
    import stoker

    ds = stoker.load.loader.open_dataset(pack)
    keys = set()
    for i in indices:
        record = ds.record(i)
        with open(pack / record["shard"], "r+b") as shard:
            shard.seek(record["offset"] + 200)
            shard.write(b"\xff\xd9" + bytes(record["size"] - 202))
        keys.add(record["key"])
    return keys


@pytest.fixture(scope="module")
def damaged(tmp_path_factory):
    """102 images, 4 of them corrupt after packing."""
    import stoker

    root = tmp_path_factory.mktemp("damaged")
    pack = root / "pack"
    stoker.pack(make_image_folder(root / "src", per_class=34, seed=3), pack, progress=False)
    keys = corrupt(pack, [6, 40, 62, 98])  # baseline JPEGs (per class: 3 is a PNG)
    return pack, keys


def shared_data() -> Path:
    if not SHARED.exists():
        pytest.skip(f"shared data not found at {SHARED}")
    return SHARED


# --- the tiers (pyproject's markers; CONTRIBUTING.md, "The tiers") --------------------------------
def pytest_collection_modifyitems(config, items) -> None:
    """A test in the slow tier says why: only make check runs it, and the reason is what a
    contributor reads before making it cheaper."""
    for item in items:
        for mark in item.iter_markers("slow"):
            reason = mark.args[0] if mark.args else mark.kwargs.get("reason", "")
            if not isinstance(reason, str) or not reason.strip():
                raise pytest.UsageError(f"{item.nodeid}: pytest.mark.slow needs its reason, "
                                        "where the time goes")  # fmt: skip


# --- the suites `make test` must run (tests/required_suites.py) -----------------------------------
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import required_suites  # noqa: E402

_REQUIRED_SKIPS: list[tuple[str, str, str]] = []  # (test, suite, reason)


def _skip_reason(report) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)


def _note_skip(report) -> None:
    if report.skipped:
        reason = _skip_reason(report)
        suite = required_suites.missing_suite(reason)
        if suite is not None:
            _REQUIRED_SKIPS.append((report.nodeid, suite, reason))


def pytest_runtest_logreport(report) -> None:
    _note_skip(report)


def pytest_collectreport(report) -> None:
    _note_skip(report)


def pytest_sessionfinish(session, exitstatus) -> None:
    """A required suite skipped for want of a dependency fails the session, saying which."""
    if not _REQUIRED_SKIPS:
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_sep("=", "required suites skipped for want of a dependency", red=True)
        for nodeid, suite, reason in _REQUIRED_SKIPS:
            reporter.write_line(f"{suite}: {nodeid}: {reason}")
        reporter.write_line("STOKER_REQUIRED_SUITES asks for them: install what they need "
                            "(make setup), or unset it to run without them")  # fmt: skip
    session.exitstatus = pytest.ExitCode.TESTS_FAILED


# --- a test host for Ray: a network namespace of the session's own (tests/servers/netns.py) ------
@pytest.fixture(scope="session")
def ray_host():
    """The network namespace the Ray tests run their nodes and this process's Ray connection in
    (one for the session: Ray's client threads start in the namespace of the thread that first
    connects, and stay there). Skipped, saying why, where namespaces cannot be made."""
    from servers import netns

    why = netns.unavailable()
    if why is not None:
        pytest.skip(f"Ray's tests run in a network namespace of their own, and {why}")
    with netns.NetworkNamespace() as ns:
        yield ns


@pytest.fixture(scope="module")
def inside_ray_host(ray_host):
    """This thread (pytest's) inside the Ray tests' namespace for a module's tests."""
    with ray_host.entered():
        yield ray_host
