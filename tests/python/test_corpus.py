"""Decoder conformance over the real corpora in ../shared/data (see its README.md).

Every file of jpeg-variety, jpeg-corrupt and png-variety goes through stoker._core.decode_image,
image_info and transform_image(size=64, train=False/True). The manifest's djpeg_2.1.5_rc column is
the oracle for JPEGs (stoker links the same libjpeg-turbo 2.1.5): 0 or 2 => decodes to the
manifest's WxH; 1 => a stoker.StokerError subclass, UnsupportedFormatError for 12-bit, lossless
and hierarchical JPEGs. Decoded pixels are compared with PIL's convert("RGB") and, where djpeg
2.1.5 is installed, with djpeg's own output.

The files run in a child process, one per folder, so that a crash names the file that caused it
instead of taking pytest down; the tests here judge the results it reports.
"""

from __future__ import annotations

import csv
import functools
import io
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import PIL.Image
import pytest

pytestmark = [
    pytest.mark.slow("each folder's files decoded by stoker, PIL and djpeg, whole and by region, "
                     "in a child process whose results the module's tests share: 10 s a folder"),
    pytest.mark.sanitize,  # drives the C++ engine: make test-asan-python runs it
]

FOLDERS = ("jpeg-variety", "jpeg-corrupt", "png-variety")
JPEG_FOLDERS = ("jpeg-variety", "jpeg-corrupt")
SIZE = 64
MAX_PIXELS = 1 << 28  # stoker's default DecodeOptions::max_pixels

# CPU time allowed per call (the worker's process time, so that a loaded machine does not fail
# the test: on a shared 2-core CI machine the 69-megapixel file took 1.8 s of wall time for
# 0.3 s of CPU). A full decode is proportional to the pixel count, so decode_image gets a
# per-pixel allowance on top of the second; image_info and the 64x64 transforms (DCT-scaled,
# region-decoded) get the second alone. A bomb burns CPU; a hang is WORKER_TIMEOUT's.
SECONDS_PER_CALL = 1.0
DECODE_SECONDS_PER_PIXEL = 10e-9
# Under ASan+UBSan (make test-asan-python preloads the runtime) code runs 2-3x slower, and a
# worker beside another test's on a 2-core machine slower still: overflow1.jpg's decode took
# 1.75 s of CPU there against a limit of 1.69 s (0.45 s without the sanitizers). A bomb is
# orders of magnitude past either limit.
if "libasan" in os.environ.get("LD_PRELOAD", ""):
    SECONDS_PER_CALL *= 3
    DECODE_SECONDS_PER_PIXEL *= 3
WORKER_TIMEOUT = 300  # seconds for a whole folder (about 10 s normally): beyond it, a hang

# djpeg's first message when it is a warning (libjpeg's JWRN_*): for rc 1 the fatal error came
# later, and in the files here always after the last scanline (junk after the image data: a
# second SOF, a bogus marker length), which stoker never reads: it stops after the rows it needs.
DJPEG_WARNINGS = (
    "Corrupt JPEG data",
    "Premature end of JPEG file",
    "Warning:",
    "Invalid SOS parameters for sequential JPEG",
)
# djpeg's refusals of valid JPEGs that libjpeg-turbo 2.1.5 cannot decode.
DJPEG_UNSUPPORTED = ("Unsupported JPEG process", "Unsupported JPEG data precision")

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


# --------------------------------------------------------------------------------------------
# The child process: runs every file of a folder and prints one JSON line per file.
# --------------------------------------------------------------------------------------------


def _compare(a: np.ndarray, b: np.ndarray) -> tuple[int, float]:
    """(max abs difference, PSNR in dB) of two uint8 images, a few rows at a time: the corpus has
    69-megapixel files, whose float64 copies would take gigabytes."""
    if np.array_equal(a, b):
        return 0, math.inf
    max_diff, sq = 0, 0
    for y in range(0, a.shape[0], 256):
        d = (a[y : y + 256].astype(np.int64) - b[y : y + 256]).ravel()
        if d.size:
            max_diff = max(max_diff, int(np.abs(d).max()))
            sq += int(np.dot(d, d))
    mse = sq / a.size
    return max_diff, (math.inf if mse == 0 else 10 * math.log10(255.0**2 / mse))


def _call(fn):
    import stoker

    t0, cpu0 = time.perf_counter(), time.process_time()
    try:
        value = fn()
        out = {"ok": True}
    except stoker.StokerError as e:
        value, out = None, {"ok": False, "exc": type(e).__name__, "stoker": True, "msg": str(e)}
    except Exception as e:  # noqa: BLE001 - any other type is what the test reports
        value, out = None, {"ok": False, "exc": type(e).__name__, "stoker": False, "msg": str(e)}
    out["t"] = time.perf_counter() - t0
    out["cpu"] = time.process_time() - cpu0
    return value, out


def _pil_reference(data: bytes):
    """PIL's RGB for the bytes, or (None, why). 16-bit greyscale is special-cased (see below)."""
    from PIL import Image

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            im = Image.open(io.BytesIO(data))
            mode = im.mode
            if mode in ("I", "I;16", "I;16B", "I;16L"):
                # PIL's convert("RGB") clips 16-bit greyscale to 0..255 (so 2304 becomes 255); a PNG
                # sample's 8-bit value is its high byte, which is what libspng (and libpng's
                # strip_16) give. Compare with that instead of PIL's clipping.
                raw = np.asarray(im).astype(np.uint32)
                grey = (raw >> 8).astype(np.uint8)
                return np.repeat(grey[..., None], 3, axis=2), mode
            return np.asarray(im.convert("RGB")), mode
    except Exception as e:  # noqa: BLE001 - PIL refusing a file is information, not an error
        return None, f"{type(e).__name__}: {e}"


def _djpeg_version() -> str | None:
    exe = shutil.which("djpeg")
    if not exe:
        return None
    r = subprocess.run([exe, "-version"], capture_output=True, text=True, check=False)
    m = re.search(r"libjpeg-turbo version (\S+)", r.stdout + r.stderr)
    return m.group(1) if m else None


def _djpeg_reference(path: Path, width: int, height: int):
    """djpeg -pnm's pixels as HxWx3 (grey replicated), or None if it gave no complete image."""
    r = subprocess.run(["djpeg", "-pnm", str(path)], capture_output=True, check=False)
    out = r.stdout
    m = re.match(rb"P([56])\s+(\d+)\s+(\d+)\s+(\d+)\s", out)
    if not m or int(m.group(4)) != 255:
        return None, r.returncode
    channels = 3 if m.group(1) == b"6" else 1
    w, h = int(m.group(2)), int(m.group(3))
    body = out[m.end() :]
    if (w, h) != (width, height) or len(body) != w * h * channels:
        return None, r.returncode  # refused before the last row: no complete image
    px = np.frombuffer(body, np.uint8).reshape(h, w, channels)
    return (np.repeat(px, 3, axis=2) if channels == 1 else px), r.returncode


def _eval_box(width: int, height: int, resize: int, crop: int):
    """torchvision Resize(resize) + CenterCrop(crop) as a box of the source (see
    test_transforms.eval_box)."""
    short, long = (width, height) if width <= height else (height, width)
    new_long = int(resize * long / short)
    new_w, new_h = (resize, new_long) if width <= height else (new_long, resize)
    top, left = int(round((new_h - crop) / 2.0)), int(round((new_w - crop) / 2.0))
    sx, sy = width / new_w, height / new_h
    return (left * sx, top * sy, (left + crop) * sx, (top + crop) * sy)


REGION_KEYS = 3


def _region_mismatches(C, data: bytes, img: np.ndarray) -> list[str]:
    """The loader decodes only the rows and iMCU columns a crop needs (plus a margin). At full
    scale that must give the bytes a whole-image decode gives: transform_image(dct_scaling=False)
    equals resize_box on decode_image's pixels, for a few training crops and the centre crop."""
    h, w = img.shape[:2]
    bad = []
    for index in range(REGION_KEYS):
        rng = C.KeyedRandom(7, 1, index)
        x0, y0, x1, y1 = C.random_resized_crop(w, h, rng)
        flip = rng.uniform(0.0, 1.0) < 0.5
        crop = np.ascontiguousarray(img[int(y0) : int(y1), int(x0) : int(x1)])
        ref = C.resize_box(crop, 0.0, 0.0, x1 - x0, y1 - y0, SIZE, SIZE)
        if flip:
            ref = ref[:, ::-1]
        try:
            out = C.transform_image(
                data, SIZE, train=True, seed=7, epoch=1, index=index, dct_scaling=False
            )[0]
        except Exception as e:  # noqa: BLE001
            bad.append(f"train crop {index} raised {type(e).__name__}: {e}")
            continue
        if not np.array_equal(out, ref):
            d = int(np.abs(out.astype(np.int16) - ref).max())
            bad.append(f"train crop {index} box {(x0, y0, x1, y1)}: max diff {d}")
    resize = round(SIZE * 256 / 224)
    if min(w, h) >= SIZE * 256 / 224:  # smaller images would need padding: refused by design
        ref = C.resize_box(img, *_eval_box(w, h, resize, SIZE), SIZE, SIZE)
        try:
            out = C.transform_image(data, SIZE, train=False, dct_scaling=False)[0]
            if not np.array_equal(out, ref):
                bad.append(f"centre crop: max diff {int(np.abs(out.astype(np.int16) - ref).max())}")
        except Exception as e:  # noqa: BLE001
            bad.append(f"centre crop raised {type(e).__name__}: {e}")
    return bad


def _worker(data_root: str, folder: str) -> None:
    import stoker._core as C

    root = Path(data_root)
    use_djpeg = folder in JPEG_FOLDERS and _djpeg_version() == "2.1.5"
    print(json.dumps({"djpeg": use_djpeg}), flush=True)
    for row in _manifest(data_root)[folder]:
        path = row["path"]
        print(json.dumps({"start": path}), flush=True)
        data = (root / path).read_bytes()
        res = {"path": path}
        _, res["info"] = _call(lambda d=data: C.image_info(d))
        img, res["decode"] = _call(lambda d=data: C.decode_image(d))
        for name, train in (("eval", False), ("train", True)):
            out, res[name] = _call(
                lambda d=data, t=train: C.transform_image(
                    d, SIZE, train=t, seed=7, epoch=1, index=3
                )[0]
            )
            if out is not None:
                res[name]["shape"] = list(out.shape)
        if img is not None:
            res["decode"]["shape"] = list(img.shape)
            res["decode"]["grey_equal_channels"] = bool(
                np.array_equal(img[..., 0], img[..., 1])
                and np.array_equal(img[..., 0], img[..., 2])
            )
            ref, mode = _pil_reference(data)
            if ref is None:
                res["pil"] = {"error": mode}
            elif ref.shape != img.shape:
                res["pil"] = {"mode": mode, "shape": list(ref.shape)}
            else:
                max_diff, psnr = _compare(img, ref)
                res["pil"] = {"mode": mode, "max_diff": max_diff, "psnr": psnr}
            if data[:2] == b"\xff\xd8":
                res["region"] = _region_mismatches(C, data, img)
            if use_djpeg and data[:2] == b"\xff\xd8":
                ref, rc = _djpeg_reference(root / path, img.shape[1], img.shape[0])
                res["djpeg"] = {"rc": rc}
                if ref is not None:
                    res["djpeg"]["max_diff"] = _compare(img, ref)[0]
        print(json.dumps(res), flush=True)
    print(json.dumps({"done": True}), flush=True)


# --------------------------------------------------------------------------------------------
# The manifest and what each file should do.
# --------------------------------------------------------------------------------------------


@functools.cache
def _manifest(data_root: str) -> dict[str, list[dict]]:
    rows: dict[str, list[dict]] = {f: [] for f in FOLDERS}
    with open(Path(data_root) / "MANIFEST.tsv", newline="") as f:
        for row in csv.DictReader(f, delimiter="\t"):
            folder = row["path"].split("/", 1)[0]
            if folder in rows:
                rows[folder].append(row)
    return rows


def _size(row) -> tuple[int, int] | None:
    m = re.fullmatch(r"(\d+)x(\d+)", row["WxH"])
    return (int(m.group(1)), int(m.group(2))) if m else None


def _too_small_for_its_size(row: dict) -> str:
    """Why stoker refuses a Huffman-coded JPEG too small to hold one scan of its claimed size
    (at least a bit per 8x8 block of its smallest component), or ''. djpeg decodes such files
    with warnings, inventing nearly every pixel; stoker's decompression-bomb check refuses them
    before allocating anything."""
    size = _size(row)
    if not size or "arith" in row["sof"] or not row["sampling"]:
        return ""
    factors = [tuple(map(int, f.split("x"))) for f in row["sampling"].split(",")]
    max_h, max_v = max(h for h, _ in factors), max(v for _, v in factors)
    blocks = min(
        math.ceil(size[0] * h / (max_h * 8)) * math.ceil(size[1] * v / (max_v * 8))
        for h, v in factors
    )
    if int(row["bytes"]) < blocks // 8:
        return f"{row['WxH']} in {row['bytes']} bytes: less than a bit per block"
    return ""


def _pil_mode(path: Path) -> str | None:
    try:
        with PIL.Image.open(path) as im:
            return im.mode
    except Exception:
        return None


def _pnm_size(path: Path) -> tuple[int, int]:
    with PIL.Image.open(path) as im:
        return im.size


def expectation(row: dict, head: bytes) -> tuple[str, str]:
    """What stoker must do with a file: (kind, why). kind is one of
    decode      decode_image returns the manifest's size; the transforms succeed
    unsupported every call raises UnsupportedFormatError
    error       decode_image raises a StokerError (a transform that reads less may succeed)
    limit       every call raises ResourceLimitError
    either      decodes or raises a StokerError: no oracle applies (see why)
    """
    folder = row["path"].split("/", 1)[0]
    if head.startswith(PNG_MAGIC):
        return "either", "PNG: PIL is the reference (djpeg refuses PNGs)"
    if head[:2] in (b"P5", b"P6"):
        # Binary PGM/PPM is the raw codec's member format (docs/FORMAT.md): 8-bit ones decode,
        # PIL is the reference; deeper ones are refused.
        mode = _pil_mode(Path(_data_root()) / row["path"])
        if mode in ("L", "RGB"):
            return "decode", f"8-bit binary PNM ({mode})"
        return "error", f"PNM of mode {mode}: the raw codec reads 8-bit only"
    if not head.startswith(b"\xff\xd8"):
        return "error", "neither JPEG nor PNG"
    rc, msg, sof, precision = (
        row["djpeg_2.1.5_rc"],
        row["djpeg_2.1.5_msg"],
        row["sof"],
        row["precision"],
    )
    if rc in ("0", "2"):
        too_small = _too_small_for_its_size(row)
        if too_small:
            return "error", too_small
        if not head.startswith(b"\xff\xd8\xff"):
            # libjpeg skips junk between SOI and the first marker (with a warning); stoker, like
            # PIL, only takes FF D8 FF for a JPEG and refuses the rest as not an image.
            return "either", "junk after SOI: djpeg warns and decodes, PIL and stoker refuse"
        size = _size(row)
        if size and size[0] * size[1] > MAX_PIXELS:
            return "limit", f"{row['WxH']} exceeds max_pixels"
        return "decode", f"djpeg rc {rc}"
    if rc == "1":
        lossless = sof.startswith(("lossless", "diff-"))
        if msg.startswith(DJPEG_UNSUPPORTED) or (
            folder == "jpeg-variety" and (lossless or precision != "8")
        ):
            return "unsupported", f"{sof} {precision}-bit: {msg}"
        if msg.startswith(DJPEG_WARNINGS):
            return "either", f"djpeg warned first, failed later: {msg}"
        return "error", f"djpeg rc 1: {msg}"
    return "either", f"no djpeg result ({rc!r})"


@functools.cache
def corpus_results(data_root: str, folder: str):
    """Runs the worker over a folder: ({path: result}, manifest rows, returncode, the file being
    processed when it died, stderr's tail, whether djpeg was compared)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    try:
        proc = subprocess.run(
            [sys.executable, __file__, data_root, folder],
            capture_output=True,
            text=True,
            env=env,
            timeout=WORKER_TIMEOUT,
            check=False,
        )
        stdout, stderr, returncode = proc.stdout, proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as e:  # a hang: the last file started is the culprit

        def text(b):
            return b.decode(errors="replace") if isinstance(b, bytes) else (b or "")

        stdout, stderr, returncode = text(e.stdout), text(e.stderr), "timeout"
    results, last_started, use_djpeg = {}, None, False
    for line in stdout.splitlines():
        msg = json.loads(line)
        if "start" in msg:
            last_started = msg["start"]
        elif "path" in msg:
            results[msg["path"]] = msg
            last_started = None
        elif "djpeg" in msg:
            use_djpeg = msg["djpeg"]
    return (
        results,
        _manifest(data_root)[folder],
        returncode,
        last_started,
        stderr[-3000:],
        use_djpeg,
    )


def _data_root() -> str:
    from conftest import shared_data

    return str(shared_data())


def _fail_list(title: str, failures: list[str], limit: int = 60) -> str:
    more = f"\n  ... and {len(failures) - limit} more" if len(failures) > limit else ""
    return f"{len(failures)} {title}:\n  " + "\n  ".join(failures[:limit]) + more


def _describe(call: dict) -> str:
    return "ok" if call["ok"] else f"{call['exc']}({call['msg'][:90]!r})"


# --------------------------------------------------------------------------------------------
# The tests.
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("folder", FOLDERS)
def test_no_file_crashes_the_process(folder):
    root = _data_root()
    results, rows, rc, last, stderr, _ = corpus_results(root, folder)
    if rc != 0:
        how = (
            f"no result after {WORKER_TIMEOUT} s"
            if rc == "timeout"
            else f"signal {signal.Signals(-rc).name}"
            if rc < 0
            else f"exit status {rc}"
        )
        pytest.fail(
            f"the decoder process died ({how}) while processing {last!r}; "
            f"{len(results)} of {len(rows)} files done.\nstderr:\n{stderr}"
        )
    assert len(results) == len(rows)


@pytest.mark.parametrize("folder", FOLDERS)
def test_outcomes_follow_the_oracle(folder):
    root = _data_root()
    results, rows, *_ = corpus_results(root, folder)
    failures, counts = [], {}
    for row in rows:
        res = results.get(row["path"])
        if res is None:
            continue  # reported by test_no_file_crashes_the_process
        with open(Path(root) / row["path"], "rb") as f:
            head = f.read(8)
        kind, why = expectation(row, head)
        outcome = f"{kind}/{'decoded' if res['decode']['ok'] else res['decode']['exc']}"
        counts[outcome] = counts.get(outcome, 0) + 1
        calls = {name: res[name] for name in ("info", "decode", "eval", "train")}
        problems = []
        for name, call in calls.items():
            if not call["ok"] and not call["stoker"]:
                problems.append(f"{name} raised {call['exc']}, not a StokerError")
        dec = calls["decode"]
        size = _size(row)
        if kind == "decode" and not dec["ok"]:
            problems.append("must decode")
        if kind in ("error", "unsupported", "limit") and dec["ok"]:
            problems.append("must raise")
        if kind == "unsupported":
            for name, call in calls.items():
                if call["ok"] or call["exc"] != "UnsupportedFormatError":
                    problems.append(f"{name} must raise UnsupportedFormatError")
        if kind == "limit":
            for name, call in calls.items():
                if call["ok"] or call["exc"] != "ResourceLimitError":
                    problems.append(f"{name} must raise ResourceLimitError")
        if dec["ok"]:
            if size and head.startswith(b"\xff\xd8") and dec["shape"] != [size[1], size[0], 3]:
                problems.append(f"decoded {dec['shape']} but the file is {row['WxH']}")
            if head[:2] in (b"P5", b"P6"):
                w, h = _pnm_size(Path(root) / row["path"])
                if dec["shape"][:2] != [h, w]:
                    problems.append(f"decoded {dec['shape']} but PIL reads {w}x{h}")
            if not calls["info"]["ok"]:
                problems.append("decodes but image_info raises")
            # The transforms read a subset of what a full decode reads.
            for name in ("eval", "train"):
                if not calls[name]["ok"]:
                    problems.append(f"decodes, but transform_image({name}) raises")
                elif calls[name]["shape"] != [SIZE, SIZE, 3]:
                    problems.append(f"transform_image({name}) gave {calls[name]['shape']}")
        if not calls["info"]["ok"]:
            # A header stoker refuses is refused by every call, with the same error.
            for name in ("decode", "eval", "train"):
                if calls[name]["ok"] or calls[name]["exc"] != calls["info"]["exc"]:
                    problems.append(
                        f"image_info raised {calls['info']['exc']} but {name} gave "
                        f"{_describe(calls[name])}"
                    )
        if problems:
            failures.append(
                f"{row['path']} [{kind}: {why}]: {'; '.join(problems)}; "
                + ", ".join(f"{n}={_describe(c)}" for n, c in calls.items())
            )
    print(
        f"\n{folder}: {len(rows)} files; expectation/decode_image outcome: "
        + ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
    )
    assert not failures, _fail_list("files broke the oracle", failures)


@pytest.mark.parametrize("folder", FOLDERS)
def test_every_call_is_fast(folder):
    results, rows, *_ = corpus_results(_data_root(), folder)
    slow, worst = [], (0.0, "")
    for row in rows:
        res = results.get(row["path"])
        if res is None:
            continue
        for name in ("info", "decode", "eval", "train"):
            call = res[name]
            limit = SECONDS_PER_CALL
            if name == "decode" and call["ok"]:
                limit += DECODE_SECONDS_PER_PIXEL * call["shape"][0] * call["shape"][1]
            worst = max(worst, (call["cpu"], f"{name} {row['path']}"))
            if call["cpu"] > limit:
                slow.append(
                    f"{row['path']}: {name} took {call['cpu']:.2f} s of CPU "
                    f"({call['t']:.2f} s wall; limit {limit:.2f} s)"
                )
    print(f"\n{folder}: slowest call {worst[0]:.3f} s of CPU ({worst[1]})")
    assert not slow, _fail_list("slow calls", slow)


@pytest.mark.parametrize("folder", FOLDERS)
def test_decoded_pixels_match_pil(folder):
    """PIL (its own libjpeg-turbo, 3.x in Pillow 11+; libpng-compatible zlib decoding) is
    torchvision's reference decoder. Expected: every PNG, and every JPEG that is not progressive,
    pixel-exact. Progressive JPEGs whose scans stop early (incomplete coefficients) go through
    libjpeg's block smoothing, which libjpeg-turbo changed after 2.1.5: those may differ by a few
    grey levels (djpeg 2.1.5, the same library stoker links, is matched exactly below)."""
    results, rows, *_ = corpus_results(_data_root(), folder)
    failures, compared, exact, psnrs, pil_refused, inexact = [], 0, 0, [], [], []
    for row in rows:
        res = results.get(row["path"])
        if res is None or "pil" not in res:
            continue
        pil = res["pil"]
        if "error" in pil:
            pil_refused.append(row["path"])
            continue
        if "psnr" not in pil:
            failures.append(
                f"{row['path']}: PIL gives {pil['shape']}, stoker {res['decode']['shape']}"
            )
            continue
        compared += 1
        psnrs.append(min(pil["psnr"], 99.0))
        if pil["max_diff"] == 0:
            exact += 1
            continue
        desc = (
            f"{row['path']} ({pil['mode']}, {row['sof']}, rc {row['djpeg_2.1.5_rc']}): "
            f"max diff {pil['max_diff']}, {pil['psnr']:.1f} dB"
        )
        inexact.append(desc)
        progressive = row["sof"].startswith("progressive")
        if not progressive or pil["psnr"] < 40.0:
            failures.append(desc)
    mean = float(np.mean(psnrs)) if psnrs else math.nan
    print(
        f"\n{folder}: {compared} decoded files compared with PIL, {exact} pixel-exact, "
        f"mean PSNR {mean:.2f} dB (exact counted as 99 dB); PIL refused {len(pil_refused)} "
        f"that stoker decodes"
    )
    for line in inexact:
        print("  not exact:", line)
    assert compared > 0
    assert not failures, _fail_list("files differ from PIL beyond the expected", failures)
    assert mean >= 60.0, f"mean PSNR vs PIL {mean:.2f} dB"


@pytest.mark.parametrize("folder", JPEG_FOLDERS)
def test_region_decode_matches_full_decode(folder):
    """Every JPEG that decodes: the loader's region decode (crop rows, iMCU columns, a margin for
    chroma upsampling and, for progressive files with incomplete scans, for block smoothing)
    gives the same pixels as a full decode; see _region_mismatches."""
    results, rows, *_ = corpus_results(_data_root(), folder)
    failures, checked = [], 0
    for row in rows:
        res = results.get(row["path"])
        if res is None or "region" not in res:
            continue
        checked += 1
        if res["region"]:
            failures.append(
                f"{row['path']} ({row['sof']}, {row['sampling']}): " + "; ".join(res["region"])
            )
    print(
        f"\n{folder}: {checked} decoded JPEGs, {REGION_KEYS} training crops and the centre crop "
        "each, region vs full decode"
    )
    assert checked > 0
    assert not failures, _fail_list("files whose region decode differs", failures)


@pytest.mark.parametrize("folder", JPEG_FOLDERS)
def test_decoded_pixels_match_djpeg(folder):
    """djpeg from libjpeg-turbo 2.1.5 (the library stoker links) must agree to the last bit on
    every JPEG stoker decodes, CMYK aside (djpeg's CMYK->RGB in PPM output is not PIL's formula,
    which stoker follows and test_decoded_pixels_match_pil checks). For files djpeg refuses
    after its last scanline (rc 1), stoker's decode must equal the complete image djpeg wrote."""
    results, rows, _, _, _, use_djpeg = corpus_results(_data_root(), folder)
    if not use_djpeg:
        pytest.skip("djpeg from libjpeg-turbo 2.1.5 is not installed")
    failures, compared = [], 0
    for row in rows:
        res = results.get(row["path"])
        if res is None or "djpeg" not in res or row["ncomp"] == "4":
            continue
        dj = res["djpeg"]
        if "max_diff" not in dj:
            failures.append(
                f"{row['path']}: stoker decodes it but djpeg (rc {dj['rc']}) "
                "wrote no complete image"
            )
            continue
        compared += 1
        if dj["max_diff"]:
            failures.append(f"{row['path']}: max diff {dj['max_diff']} from djpeg")
        if not res["decode"]["grey_equal_channels"] and row["ncomp"] == "1":
            failures.append(f"{row['path']}: greyscale decoded with unequal channels")
    print(f"\n{folder}: {compared} decoded JPEGs compared with djpeg 2.1.5")
    assert compared > 0
    assert not failures, _fail_list("files differ from djpeg", failures)


if __name__ == "__main__":
    _worker(sys.argv[1], sys.argv[2])
