"""Summary rows as CSV text: :func:`rows_to_csv` writes a study's ``summary.csv``,
:func:`csv_to_rows` reads it back with numbers parsed."""
from __future__ import annotations

import csv
import io


def rows_to_csv(rows: list[dict]) -> str:
    """CSV text of summary rows (union of keys, in first-seen order)."""
    cols = list(dict.fromkeys(k for r in rows for k in r))
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=cols, restval="", lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in r.items()})
    return buf.getvalue()


def _parse_cell(text: str):
    """A CSV cell back to int / float (``inf``/``nan`` included) where it is one, else the text."""
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def csv_to_rows(text: str) -> list[dict]:
    """The rows of :func:`rows_to_csv`'s text, numbers parsed back."""
    return [{k: _parse_cell(v) for k, v in r.items()} for r in csv.DictReader(io.StringIO(text))]
