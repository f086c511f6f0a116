"""The run index: committed run events materialized into a database for listing and search
(docs/index.md). `Indexer` writes it, `SQLiteIndex` reads and writes it."""

from processors.index.ingest import Indexer, IngestReport
from processors.index.projection import RunRow, StepRow
from processors.index.store import CursorError, Page, RunFilter, SQLiteIndex

__all__ = ["CursorError", "Indexer", "IngestReport", "Page", "RunFilter", "RunRow", "SQLiteIndex", "StepRow"]
