"""Multi-query associative recall (MQAR, Zoology arXiv:2312.04927): models trained per cell over a sweep.

Importing this package registers the ``mqar`` task. Its parts, by job:

* :mod:`evalsuite.data.mqar`: the data (Zoology's ``multiquery_ar`` generator, seeded, machine-independent);
* :mod:`.sweep`: the sweep's settings (``tasks/mqar.yaml`` presets), its cells and each cell's hashed config;
* :mod:`.cell`: training one cell and its record;
* :mod:`.stack`: cells that differ only in learning rate or seed trained as one stacked model, and the pool's units
  (a cell alone or a stack);
* :mod:`evalsuite.tasks.mqar_summary` (beside this package, free of torch): best accuracy over learning rates,
  for ``results.json`` and :mod:`evalsuite.report.mqar`, and the accuracy check;
* :mod:`.task`: :class:`MQARTask` on the runner, units spread over :func:`evalsuite.training.pool.run_pool` workers.

Each cell trains a fresh model with :func:`evalsuite.training.train.train` and appends one record (query accuracy on the
test set) to ``records.jsonl``. Cells are keyed by a hash of their config, so a rerun skips finished cells: an
interrupted sweep loses at most the cells in flight, and new models add rows to an existing run directory.
"""

from evalsuite.tasks.mqar.cell import DataCache, decode_state_size, run_cell
from evalsuite.tasks.mqar.sweep import (
    Cell,
    MQARSweep,
    cell_config,
    data_config,
    default_run_dir,
    load_preset,
    resolve_model,
    sweep_cells,
    sweep_from_options,
)
from evalsuite.tasks.mqar.task import MQARTask, run_mqar
from evalsuite.tasks.mqar_summary import best_over_lr, best_records, check_best, records_frame, shared_provenance

__all__ = [
    "Cell",
    "DataCache",
    "MQARSweep",
    "MQARTask",
    "best_over_lr",
    "best_records",
    "cell_config",
    "check_best",
    "data_config",
    "decode_state_size",
    "default_run_dir",
    "load_preset",
    "records_frame",
    "resolve_model",
    "run_cell",
    "run_mqar",
    "shared_provenance",
    "sweep_cells",
    "sweep_from_options",
]
