"""stoker.diagnose and stoker.watch: what bounds a training job, with numbers.

``diagnose(loader, step)`` runs the seeds' experiments itself:

1. the loader alone (how fast can data come?);
2. the step alone on one cached batch, already on the device (how fast could training go if data
   were free? the seeds' synthetic-data experiment);
3. both together, timing for each step the wait for data and the step itself.

Meanwhile a sampler thread records CPU use per core, and the process's I/O. The verdict follows
from the three rates. For a data-bound job a sub-verdict names the stage: stoker's per-stage
times for an ImageLoader, process counters otherwise. Each recommendation is measured where that
is quick: a sibling loader with more threads or workers, a pack of a few samples resized with
``max_side``, the step under autocast or on a doubled batch, a pinned copy.

``watch(loader)`` observes a real training loop instead, without changing it. ``sweep`` (sweep.py)
times loaders built with each value of a setting; ``Diagnosis.to_html`` writes report.py's page.

What the doctor needs of a loader it asks the loader's adapter (adapters.py), one per kind of
loader: a stoker loader, a torch DataLoader, any other iterable of batches. ``adapter_for`` is the
only place that asks which kind a loader is.
"""

from .diagnosis import diagnose
from .model import builtin_step
from .result import DATA_CAUSES, VERDICTS, Diagnosis, Recommendation
from .watching import watch

__all__ = [
    "DATA_CAUSES",
    "VERDICTS",
    "Diagnosis",
    "Recommendation",
    "builtin_step",
    "diagnose",
    "watch",
]
