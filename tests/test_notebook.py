"""``examples/quickstart.ipynb`` run by a real Jupyter kernel (nbclient + ipykernel).

The kernel connects to this test session's Ray cluster (``RAY_ADDRESS``), so what it leaves
behind is visible here: re-running the cell that builds a Trainer releases the previous one's
workers, and none is left once the kernel is shut down.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from sgd_testing import wait_for

nbclient = pytest.importorskip("nbclient", reason="needs nbclient and ipykernel (in the nox test dependencies)")
nbformat = pytest.importorskip("nbformat")
pytest.importorskip("ipykernel")
pytest.importorskip("torch")

NOTEBOOK = Path(__file__).resolve().parents[1] / "examples" / "quickstart.ipynb"
TRAINER_CELL = 2


def _actors() -> list:
    """Every actor of the cluster, from the GCS's table (the state API would need the dashboard)."""
    import ray._private.state

    return list(ray._private.state.actors().values())


def _alive_workers(job_ids: set) -> int:
    return sum(1 for a in _actors()
               if a["State"] == "ALIVE" and a["ActorClassName"] == "_PlainWorker" and a["JobID"] not in job_ids)


def _text(cell) -> str:
    return "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream")


def test_quickstart_notebook_runs_in_a_kernel_and_leaves_no_workers(ray_cluster, tmp_path, monkeypatch):
    import ray

    ours = {ray.get_runtime_context().get_job_id()}
    before = {a["JobID"] for a in _actors()}
    monkeypatch.setenv("RAY_ADDRESS", ray.get_runtime_context().gcs_address)
    monkeypatch.setenv("SGD_RESULTS_DIR", str(tmp_path / "results"))
    monkeypatch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    others = ours | before  # workers of jobs that existed before the kernel: not the notebook's

    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    with client.setup_kernel():
        for index, cell in enumerate(nb.cells):
            client.execute_cell(cell, index)
            if index == TRAINER_CELL:
                assert _alive_workers(others) == 2
                client.execute_cell(cell, index)  # run again: a new trainer under the same name
                wait_for(lambda: _alive_workers(others) == 2, timeout=60,
                         message="the first trainer's workers were not released")
        assert "final loss per worker" in _text(nb.cells[3])
        assert "30 epochs reported in all" in _text(nb.cells[4])
        assert any("image/png" in o.get("data", {}) for o in nb.cells[5].outputs)  # the plot
        assert _alive_workers(others) == 0  # the last cell shut the trainer down
        client.execute_cell(nb.cells[TRAINER_CELL], TRAINER_CELL)  # and a trainer left running...
        assert _alive_workers(others) == 2
    # ...goes with the kernel.
    wait_for(lambda: _alive_workers(others) == 0, timeout=60, message="workers outlived the kernel")
