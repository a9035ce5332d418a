"""How the training scripts here end: their gloo process group ended by the script, as a
training script should end it, not left to interpreter shutdown."""

from __future__ import annotations

import gc

import torch


def end_process_group() -> None:
    """Ends the default process group, once the caller has let go of its trainer and DDP model.

    Left to interpreter shutdown, a gloo thread may still be releasing a collective's tensors
    there, and needs the GIL that no longer exists (std::terminate, "terminate called without
    an active exception", exit -6). And DDP's reducer must be gone first: destroyed as the
    group's last holder, the group's destructor waits for that thread while holding the GIL the
    thread needs (pytorch/pytorch#56297: a hang, 2 runs in about 14 of the Hugging Face script)."""
    if not torch.distributed.is_initialized():
        return
    gc.collect()  # a trainer's reference cycles, DDP's reducer among them
    torch.distributed.barrier()  # no rank ends the group while another is in a collective
    torch.distributed.destroy_process_group()
