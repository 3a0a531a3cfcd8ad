"""The notebook runs headless from a fresh clone, started from the repository root or from ``notebooks/``."""

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK = ROOT / "notebooks" / "compare_runs.ipynb"


def test_notebook_is_stored_without_outputs():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    assert all(not c.get("outputs") and c.get("execution_count") is None for c in nb.cells if c.cell_type == "code")


@pytest.mark.parametrize("start", [ROOT, ROOT / "notebooks"], ids=["from-root", "from-notebooks"])
def test_notebook_executes_and_shows_plots_inline(start, tmp_path_factory, monkeypatch):
    runs = tmp_path_factory.getbasetemp() / "notebook-runs"  # shared: the second start resumes the first's runs
    monkeypatch.setenv("EVALSUITE_NOTEBOOK_RUNS", str(runs))
    monkeypatch.setenv("MPLBACKEND", "Agg")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(start)}}).execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    assert len(images) == 2  # the loss overlay and the NIAH heatmaps, inline
    assert (runs / "loss_overlay.png").is_file() and (runs / "niah_heatmaps.png").is_file()
