"""Heart-disease style records for the example DAGs, the demo and the tests.

Not part of the emulator: the example DAGs run against Azure too, and must not depend on the
emulator. Every row has a unique ``row_id`` so that scored output can be checked for rows lost
or duplicated.
"""

from __future__ import annotations

import csv
import random
from pathlib import Path

COLUMNS = ["row_id", "age", "sex", "cp", "trestbps", "chol", "fbs", "restecg", "thalach", "exang", "oldpeak"]


def heart_rows(count: int, *, seed: int = 0, id_prefix: str = "", start: int = 0) -> list[list[object]]:
    """``count`` rows of heart-disease features with unique ids ``id_prefix + counter``."""
    rng = random.Random(seed)
    return [
        [
            f"{id_prefix}{start + i:07d}",
            rng.randint(29, 77),
            rng.randint(0, 1),
            rng.randint(0, 3),
            rng.randint(94, 200),
            rng.randint(126, 564),
            rng.randint(0, 1),
            rng.randint(0, 2),
            rng.randint(71, 202),
            rng.randint(0, 1),
            round(rng.uniform(0, 6.2), 1),
        ]
        for i in range(count)
    ]


def write_heart_csvs(folder: Path, *, files: int, rows_per_file: int, seed: int = 0, id_prefix: str = "") -> int:
    """Write ``files`` CSV files of ``rows_per_file`` rows each; returns the number of rows written."""
    folder.mkdir(parents=True, exist_ok=True)
    written = 0
    for index in range(files):
        target = folder / f"part-{index:04d}.csv"
        tmp = target.with_suffix(".tmp")
        with open(tmp, "w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(COLUMNS)
            writer.writerows(heart_rows(rows_per_file, seed=seed * 100_003 + index, id_prefix=id_prefix, start=written))
        written += rows_per_file
        tmp.replace(target)
    return written


def scored_row_ids(predictions: str, inputs: dict[str, list[str]]) -> list[str]:
    """The row id of every line of an ``append_row`` output (``predictions.csv``), in order.

    Two shapes, both one CSV line per scored row, without a header (docs/azure.md, "The model"):

    - the example's scoring script (``dags/azureml/score/score.py``): ``<file>,<row_id>,<probability>,<prediction>``;
    - an MLflow model deployed without a scoring script: ``<row>,<prediction>,<file_name>``, where ``row`` is
      the row's index in its input file (Microsoft Learn, *Deploy MLflow models in batch deployments*,
      "Analyze outputs": "You can rely on the row number to match the corresponding prediction"). Row
      ``k`` of a file is the k-th row id of that input file (``inputs``: file name -> its row ids in
      order); a row beyond a file's rows, or of an unknown file, gets an id no input has.
    """
    ids: list[str] = []
    for record in csv.reader(line for line in predictions.splitlines() if line.strip()):
        if len(record) == 3 and record[0].isdigit():
            k, file_name = int(record[0]), record[2]
            rows = inputs.get(file_name, [])
            ids.append(rows[k] if k < len(rows) else f"{file_name}#extra-{k}")
        else:
            ids.append(record[1])
    return ids


def input_row_ids(folder: Path) -> dict[str, list[str]]:
    """``{file name: [row ids in file order]}`` of a local folder of input CSV files."""
    return {
        path.name: [row["row_id"] for row in csv.DictReader(path.read_text().splitlines())]
        for path in sorted(folder.glob("*.csv"))
    }
