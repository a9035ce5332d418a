"""stoker.mix: batches drawn from several loaders in given proportions, deterministic and
resumable (docs/MIX.md).

    mixed = stoker.mix([coco, objects365], weights=[0.7, 0.3], seed=0)
    for epoch in range(start_epoch, 90):
        mixed.set_epoch(epoch)
        for batch in mixed: ...
        torch.save({"data": mixed.state_dict(), ...}, "ckpt.pt")

Which source gives step ``s``'s batch is a pure function of (seed, epoch, s) and of which
sources have run out: never of timing, threads or how often the job was resumed.

The package, by concern: ``draws`` (the keyed number of each step and the weights' schedule),
``position`` (where an epoch stands, the stopping rules, the epoch replayed without batches),
``structure`` (what two sources' batches must share), ``iterable`` (the ``Mix`` itself) and
``api`` (the ``mix()`` function).
"""

from .api import mix
from .draws import Schedule, Weights, keyed_uniform
from .iterable import Mix
from .position import RESTART_EPOCH_STRIDE, StopRule, epoch_length, replay

__all__ = [
    "RESTART_EPOCH_STRIDE",
    "Mix",
    "Schedule",
    "StopRule",
    "Weights",
    "epoch_length",
    "keyed_uniform",
    "mix",
    "replay",
]
