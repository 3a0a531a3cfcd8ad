"""NIAH, per-token loss and LongBench on fox-pro-tiny (CPU), each into ``OUT/<task>``: run in the test process it is
the single-process reference; under ``torchrun`` every rank runs it (tests/test_distributed.py).

    python -m torch.distributed.run --standalone --nproc-per-node 3 tests/dist_driver.py DATA OUT
"""

import sys
from pathlib import Path

LONGBENCH_TASKS = ["trec", "triviaqa", "lcc"]


def run_all(data: Path, out: Path) -> dict:
    """The three runs (fixtures under ``data``: ``docs/`` text documents, ``longbench/`` LongBench-format files);
    returns {task: results}."""
    from evalsuite.adapters.registry import AdapterOptions, load_adapter
    from evalsuite.tasks.longbench import LongBenchConfig, run_longbench
    from evalsuite.tasks.loss import LossConfig, run_loss
    from evalsuite.tasks.niah import NiahConfig, run_niah

    adapter = load_adapter("fox-pro-tiny", AdapterOptions(device="cpu"))
    # 2-hop cells (two records each), 5 batches of 2 cells: batches straddle the ranks whatever their number
    niah = NiahConfig(mode="2hop", lengths=[400, 700], depths=[0, 25, 50, 75, 100], max_new_tokens=5, batch_size=4)
    # 9 documents, one too short, in batches of 2: the last step of 2 or 3 ranks is partial
    loss = LossConfig(data=str(data / "docs"), length=96, batch_size=2)
    longbench = LongBenchConfig(data=str(data / "longbench"), tasks=LONGBENCH_TASKS, batch_size=2, max_length=600)
    return {
        "niah": run_niah(adapter, niah, out / "niah", progress=False),
        "loss": run_loss(adapter, loss, out / "loss", progress=False),
        "longbench": run_longbench(adapter, longbench, out / "longbench", progress=False),
    }


if __name__ == "__main__":
    run_all(Path(sys.argv[1]), Path(sys.argv[2]))
