"""stoker inside the trainers people use. Lightning needs nothing from here: a stoker loader
speaks its protocols (ranks at the pass, ``sampler.set_epoch``, ``state_dict``, pickling).
Hugging Face's Trainer builds its own DataLoader and resumes by re-reading batches; its
stoker-aware subclass is in :mod:`stoker.integrations.huggingface`. docs/INTEGRATIONS.md has a
recipe per trainer."""
