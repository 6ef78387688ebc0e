"""procbus keeps the table metadata it read or wrote last parsed (a pipeline's commit builds on
the one its last commit wrote): a file written again at the same place is read again, never
served from what was kept."""

from __future__ import annotations

from pathlib import Path

from procbus.lakehouse import iceberg
from procbus.lakehouse.schemas import parse_columns


def test_a_metadata_file_written_again_in_place_is_read_again(tmp_path: Path) -> None:
    folder = tmp_path / "accounts"
    first = iceberg.new_table(folder, parse_columns("id:bigint"), [], {}, created_by="p-1")
    loaded = iceberg.load_table(iceberg.StagingCatalog(), "bank", "accounts", first, folder)
    assert [field.name for field in loaded.schema().fields] == ["id"]
    # The same creator at the same place writes the same file name (a creation tried again).
    again = iceberg.new_table(
        folder, parse_columns("id:bigint,note:string"), [], {}, created_by="p-1"
    )
    assert again == first
    reloaded = iceberg.load_table(iceberg.StagingCatalog(), "bank", "accounts", again, folder)
    assert [field.name for field in reloaded.schema().fields] == ["id", "note"]
