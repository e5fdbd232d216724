"""`supervisor/commands/` only renders: what a command shows of the state database it asks the
ledger's read side for (`supervisor/ledger/reads.py`), so that a query has one home beside the
schema it reads, and the supervisor, `observe/` and the commands read the same rows the same
way. A command may still open a read-only connection (`observe.readonly`) and catch
`sqlite3.Error`; it never writes SQL of its own."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

COMMANDS = Path(__file__).resolve().parents[1] / "supervisor" / "commands"

# SQL as it is written in this code base (upper-case keywords), and the calls that run it.
_SQL = re.compile(
    r"\bSELECT\b|\bINSERT\s+(OR\s+\w+\s+)?INTO\b|\bUPDATE\s+\w+\s+SET\b|\bDELETE\s+FROM\b"
    r"|\bPRAGMA\b|\bsqlite3\.connect\s*\(|\.execute(many|script)?\s*\("
)


def _sql_lines(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if _SQL.search(line)]


@pytest.mark.parametrize("path", sorted(COMMANDS.glob("*.py")), ids=lambda p: p.name)
def test_a_command_holds_no_sql(path: Path) -> None:
    assert _sql_lines(path.read_text()) == [], f"{path.name}: move the query to ledger/reads.py"


def test_the_check_sees_sql() -> None:
    text = """
rows = conn.execute(f"SELECT DISTINCT {column} FROM {table}")
"INSERT OR IGNORE INTO boots(boot_id) VALUES (?)"
conn.execute("UPDATE boots SET last_seen = ?", (now,))
conn = sqlite3.connect(uri, uri=True)
"""
    assert len(_sql_lines(text)) == 4
    assert _sql_lines("except sqlite3.Error as exc:\nconn: sqlite3.Connection | None") == []
