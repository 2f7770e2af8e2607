import pytest

from draftsmith.core.atomic import atomic_path, write_json


def test_failed_write_leaves_no_file_and_no_temporary(tmp_path):
    dest = tmp_path / "out.json"
    with pytest.raises(RuntimeError), atomic_path(dest) as tmp:
        tmp.write_text("half")
        raise RuntimeError("killed")
    assert list(tmp_path.iterdir()) == []


def test_replaces_files_and_folders_whole(tmp_path):
    write_json(tmp_path / "a.json", {"v": 1})
    write_json(tmp_path / "a.json", {"v": 2})
    assert (tmp_path / "a.json").read_text().strip().endswith("}") and '"v": 2' in (tmp_path / "a.json").read_text()
    for content in ("old", "new"):
        with atomic_path(tmp_path / "dir") as tmp:
            tmp.mkdir()
            (tmp / "f").write_text(content)
    assert (tmp_path / "dir" / "f").read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json", "dir"]
