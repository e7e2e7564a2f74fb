"""The report as one document: ``report.json`` holds it, ``report.md`` and
``report_appendix.md`` are rendered from it.

A document is a dict (JSON types only): ``report`` and ``appendix``, each a
list of blocks, and ``tables``, every table by name as records. A block is a
line of markdown (a string) or a table shown there (``{"table": NAME,
"rows": N, "rest": TEXT}``: the first N records, then a line saying how many
more and where they are; ``rows`` null for the whole table). A table holds its
``columns``, its ``records`` (at most :data:`RECORDS_MAX`; ``total_rows``
counts them all) and ``points``: how many distinct points its figures are
over, and their ids where the figures compare implementations.

Markdown is only ever made by :func:`markdown` from such a document, so the
two files cannot disagree.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from ._review import frame_md, json_value

RECORDS_MAX = 2000  # a table's records kept (a 200k-row run is for tools, not eyes)
WHOLE_REST = "more rows not listed: see the results CSV"


@dataclass
class Table:
    """One table of the report: a frame (its index, when it names rows, kept
    as leading columns) and the points its figures are over."""

    name: str
    frame: pd.DataFrame
    title: str = ""
    points: int | None = None  # distinct points the figures are over
    point_ids: list[str] | None = None  # their ids, where the figures compare implementations
    extra: dict = field(default_factory=dict)

    def record(self) -> dict:
        frame = self.frame
        out: dict = {"title": self.title, "columns": [str(c) for c in frame.columns],
                     "records": records(frame.head(RECORDS_MAX)), "total_rows": len(frame)}
        if self.points is not None:
            out["points"] = int(self.points)
        if self.point_ids is not None:
            out["point_ids"] = list(self.point_ids[:RECORDS_MAX])
        out.update(self.extra)
        return out


def table(name: str, frame: pd.DataFrame, index: bool = False, **kw) -> Table:
    """A Table of ``frame`` (with its index as leading columns when ``index``)."""
    frame = frame.reset_index() if index else frame
    return Table(name, frame.set_axis([str(c) for c in frame.columns], axis=1), **kw)


@dataclass(frozen=True)
class Show:
    """A table shown in the report or its appendix: its first ``rows`` records
    (None: the whole table, up to :data:`RECORDS_MAX`), then ``rest``."""

    table: Table
    rows: int | None = None
    rest: str = WHOLE_REST


def records(frame: pd.DataFrame) -> list[dict]:
    """The rows of ``frame`` as dicts of JSON values (read column by column)."""
    cols = [str(c) for c in frame.columns]
    values = [[json_value(v) for v in frame.iloc[:, i].tolist()] for i in range(len(cols))]
    return [dict(zip(cols, row)) for row in zip(*values)]


def document(report: list, appendix: list) -> dict:
    """The JSON document of report and appendix blocks (strings and :class:`Show`).
    A table shown twice (cut in the report, whole in the appendix) is one
    table; two different tables of one name get ``_2``, ``_3``, ... appended."""
    tables: dict[str, dict] = {}
    names: dict[int, str] = {}

    def blocks(items: list) -> list:
        out = []
        for item in items:
            if isinstance(item, Show):
                t = item.table
                if id(t) not in names:
                    name, n = t.name, 1
                    while name in tables:
                        n += 1
                        name = f"{t.name}_{n}"
                    names[id(t)] = name
                    tables[name] = t.record()
                out.append({"table": names[id(t)], "rows": item.rows, "rest": item.rest})
            else:
                out.append(str(item))
        return out

    return {"report": blocks(report), "appendix": blocks(appendix), "tables": tables}


def _shown(t: dict, rows: int | None, rest: str) -> list[str]:
    if not t["total_rows"]:
        return ["_(none)_"]
    limit = len(t["records"]) if rows is None else min(rows, len(t["records"]))
    out = [frame_md(pd.DataFrame.from_records(t["records"], columns=t["columns"]).head(limit))]
    if t["total_rows"] > limit:
        out += ["", f"... {t['total_rows'] - limit} {rest}"]
    return out


def render_blocks(doc: dict, key: str) -> str:
    lines: list[str] = []
    for block in doc[key]:
        if isinstance(block, dict):
            lines += _shown(doc["tables"][block["table"]], block["rows"], block["rest"])
        else:
            lines.append(block)
    return "\n".join(lines)


def markdown(doc: dict) -> tuple[str, str]:
    """(report.md, report_appendix.md) of a document (as built, or read back from report.json)."""
    return render_blocks(doc, "report"), render_blocks(doc, "appendix")
