"""Write the bundled calibration inputs of the built-in demo models (``calibration/data/``).

Run from anywhere: ``python calibration/make_demo_data.py``. The output is byte-for-byte the same
on every run (fixed seeds, fixed zip timestamps), so a rerun shows no git diff.

The built-in models have seeded random weights and no tokenizer, so their "text" is uniformly
random token ids; the sequence lengths vary and exceed ``index_topk`` so the indexer's selection
is exercised during calibration. The recipes take the first ``samples`` files for calibration and
hold out the rest for the accuracy report.
"""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent

#: folder -> (vocab size, batch, sequence lengths cycled over the files, number of files, seed)
DATASETS = {
    "tiny": (256, 2, (64, 96, 128, 48), 20, 20260101),
    "small": (1024, 1, (320, 384), 12, 20260102),
}


def write_npz(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """Like ``np.savez_compressed`` but with a fixed timestamp, so the bytes are reproducible."""
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for name, array in arrays.items():
            buffer = io.BytesIO()
            np.lib.format.write_array(buffer, np.ascontiguousarray(array), allow_pickle=False)
            info = zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(info, buffer.getvalue())


def main() -> None:
    for folder, (vocab, batch, seq_lens, count, seed) in DATASETS.items():
        out = HERE / "data" / folder
        out.mkdir(parents=True, exist_ok=True)
        for old in out.glob("*.npz"):
            old.unlink()
        rng = np.random.default_rng(seed)
        for i in range(count):
            seq_len = seq_lens[i % len(seq_lens)]
            ids = rng.integers(0, vocab, size=(batch, seq_len), dtype=np.int64)
            write_npz(out / f"sample_{i:03d}.npz", {"input_ids": ids})
        print(f"wrote {count} samples to {out}")


if __name__ == "__main__":
    main()
