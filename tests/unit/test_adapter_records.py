"""The adapters read and write records in one place: every store and queue of both clouds goes
through ``runplane/adapters/records.py`` (over ``domain/wire.py``), so a record of another release
is read and kept alike everywhere. A store that validated or dumped a model itself would be strict,
or drop the fields it does not know, on its own."""

import ast
from pathlib import Path

ADAPTERS = Path(__file__).resolve().parents[2] / "runplane" / "adapters"
OWN_WAY = {"model_validate", "model_validate_json", "model_dump", "model_dump_json"}


def _ways(path: Path) -> list[str]:
    """Where ``path`` reads or writes a record other than through records.py."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Attribute) and node.attr in OWN_WAY:
            found.append(f"{path.name}:{node.lineno} .{node.attr}")
        if isinstance(node, ast.ImportFrom) and node.module == "runplane.domain.wire":
            found.append(f"{path.name}:{node.lineno} imports runplane.domain.wire")
    return found


def test_only_the_records_module_reads_and_writes_records():
    modules = [p for p in ADAPTERS.rglob("*.py") if p.name != "records.py" or p.parent != ADAPTERS]
    assert len(modules) > 20
    assert [way for path in sorted(modules) for way in _ways(path)] == []


def test_the_finder_finds_a_store_of_its_own(tmp_path):
    store = tmp_path / "store.py"
    store.write_text(
        "from runplane.domain.wire import stored\n\ndef read(item):\n    return Run.model_validate(item)\n"
    )
    assert _ways(store) == ["store.py:1 imports runplane.domain.wire", "store.py:4 .model_validate"]
