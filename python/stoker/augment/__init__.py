"""Batch augmentations on the batch's own device: each sample with its own parameters, drawn
from the keyed generator (seed, epoch, sample index), no Python loop over samples.

``stoker.augment.functional`` holds each operation as a function of the batch and per-sample
parameters, under torchvision.transforms.v2.functional's names; ``stoker.augment.mix`` MixUp
and CutMix with soft targets; ``stoker.augment.audio`` the log-mel spectrogram, SpecAugment's
masks and gain/noise for audio batches; ``stoker.augment.keyed`` the per-sample draws.
"""

from . import audio, functional, mix
from .audio import FrequencyMasking, GainNoise, MelSpectrogram, TimeMasking
from .keyed import KeyedDraws
from .mix import MixUp
from .ops import (
    BatchOp,
    ColorJitter,
    Compose,
    DrawnOp,
    GaussianBlur,
    RandomErasing,
    RandomGrayscale,
)
from .policies import RandAugment, TimmRandAugment, TrivialAugmentWide

__all__ = [
    "BatchOp",
    "ColorJitter",
    "Compose",
    "DrawnOp",
    "FrequencyMasking",
    "GainNoise",
    "GaussianBlur",
    "KeyedDraws",
    "MelSpectrogram",
    "MixUp",
    "RandAugment",
    "RandomErasing",
    "RandomGrayscale",
    "TimeMasking",
    "TimmRandAugment",
    "TrivialAugmentWide",
    "audio",
    "functional",
    "mix",
]
