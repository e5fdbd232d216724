"""The documentation stays true: the README stays a front page, no page cites an issue number,
every relative link (and anchor) resolves, docs/configuration.md documents exactly the keys that
supervisor/config.py accepts, and docs/observability.md exactly the fields of the `rlsup status
--json` schema. Fast: files and imports only, no processes."""

from __future__ import annotations

import copy
import re
import types
import typing
import unicodedata
from pathlib import Path
from typing import Any

import pytest

from supervisor.config import ConfigError, parse_config

try:  # the schema's home after the supervisor's split into wings
    from supervisor.observe import schema as status_schema
except ImportError:  # before it
    from supervisor.commands import status_schema  # type: ignore[no-redef]

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
README = REPO / "README.md"
README_MAX_LINES = 300


def pages() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


def page_id(p: Path) -> str:
    return str(p.relative_to(REPO))


# ---- markdown helpers ---------------------------------------------------------------------

_FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.M | re.S)
_INDENTED = re.compile(r"(?:^(?: {4}|\t)[^\n]*\n?)+", re.M)
_CODE_SPAN = re.compile(r"(`+)(?!`).+?(?<!`)\1", re.S)
_LINK = re.compile(r"(?<!!)\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")


def prose(text: str) -> str:
    """The text outside fenced and indented code blocks and code spans (each replaced by a
    space, so that words on either side stay apart)."""
    text = _FENCE.sub(" ", text)
    text = _INDENTED.sub(" ", text)
    return _CODE_SPAN.sub(" ", text)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, code and punctuation marks dropped (letters,
    digits, spaces, '-' and '_' kept), spaces to '-'."""
    text = heading.strip().lower()
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link: its text
    out = []
    for ch in text:
        cat = unicodedata.category(ch)
        if ch in " -_" or cat[0] in "LN":
            out.append("-" if ch == " " else ch)
    return "".join(out)


def anchors(text: str) -> set[str]:
    """The anchors of a page's headings, with GitHub's -1, -2 for repeats."""
    seen: dict[str, int] = {}
    out: set[str] = set()
    for line in _FENCE.sub("", text).splitlines():
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        base = slug(m.group(1))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def links(text: str) -> list[str]:
    """Link targets in the prose (not in code)."""
    return [m.group(1) for m in _LINK.finditer(prose(text))]


def tables(text: str, first_header: str) -> list[list[list[str]]]:
    """Every markdown table whose first header cell is `first_header`: its body rows, as cells."""
    out: list[list[list[str]]] = []
    rows: list[list[str]] | None = None
    lines = _FENCE.sub("", text).splitlines()
    for i, line in enumerate(lines):
        if not line.startswith("|"):
            rows = None
            continue
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
        if rows is not None:
            rows.append(cells)
        elif (
            cells
            and cells[0] == first_header
            and i + 1 < len(lines)
            and re.fullmatch(r"\|(\s*:?-+:?\s*\|)+", lines[i + 1].strip())
        ):
            rows = []
            out.append(rows)
    # the separator row was appended as the first body row: drop it
    return [[r for r in t if not all(re.fullmatch(r":?-+:?", c) for c in r)] for t in out]


# ---- the README is a front page ------------------------------------------------------------


def test_the_readme_is_a_front_page() -> None:
    n = len(README.read_text().splitlines())
    assert n <= README_MAX_LINES, f"README.md has {n} lines; move detail to docs/"


def test_the_readme_keeps_the_two_commands() -> None:
    text = README.read_text()
    assert "make run    #" in text and "make test   #" in text


def test_each_docs_page_says_what_it_is_and_links_back() -> None:
    for page in sorted(DOCS.glob("*.md")):
        lines = page.read_text().splitlines()
        assert lines[0].startswith("# "), f"{page_id(page)}: starts with its title"
        summary = next(line for line in lines[1:] if line.strip())
        assert not summary.startswith(("#", "|", "```")), f"{page_id(page)}: a summary first"
        head = "\n".join(lines[:8])
        assert "](../README.md)" in head, f"{page_id(page)}: links back to the README"


# ---- no issue numbers ----------------------------------------------------------------------

# "issue 18", "Issue 12's", "issues 14 and 16", "issue #7", "pull request 3", and a bare "#12"
# in prose (not "#fff", not a 6-digit colour "#123456", not "ckpt-#", not an anchor "(#x)",
# not "C#"); code blocks, code spans and link targets are left out before these are applied.
ISSUE_PATTERNS = (
    re.compile(r"\b(?:issues?|pull requests?|PRs?)\s*#?\d+", re.I),
    re.compile(r"(?<![\w&#/:-])#\d{1,5}(?![\w-])"),
)


def issue_refs(text: str) -> list[str]:
    body = prose(text)
    body = _LINK.sub(lambda m: m.group(0)[: m.group(0).index("](")], body)  # drop targets
    body = re.sub(r"<[^>\n]*>", " ", body)  # HTML tags and their attributes
    return [m.group(0) for p in ISSUE_PATTERNS for m in p.finditer(body)]


@pytest.mark.parametrize(
    "text",
    [
        "fixed in issue 18",
        "Issue 12 (one owner per fact)",
        "the target of issue 16's list",
        "issues 14 and 16",
        "see issue #7",
        "see #12 for why",
        "(#3)",
        "done in pull request 42",
        "PR #9",
    ],
)
def test_the_issue_pattern_finds(text: str) -> None:
    assert issue_refs(text), text


@pytest.mark.parametrize(
    "text",
    [
        "the colour #fff and #1a2b3c and #123456",
        "`ckpt-#12` in code and `issue 18` in a span",
        "```\nissue 18 in a block\n```",
        "an anchor [here](figures.md#the-fault-injection-soak) and [x](#section-2)",
        "C#7 is not a thing, nor is ckpt-#3",
        "`--threads N` at 20 MB/s, 75 on request, 2026-11-24",
        "tissue 5 and misissued 3 are words",
        '<span style="color:#123">x</span>',
    ],
)
def test_the_issue_pattern_leaves_alone(text: str) -> None:
    assert issue_refs(text) == [], text


@pytest.mark.parametrize("page", pages(), ids=page_id)
def test_no_issue_numbers(page: Path) -> None:
    found = issue_refs(page.read_text())
    assert found == [], f"{page_id(page)}: say what the thing is, not its issue number: {found}"


# ---- links ---------------------------------------------------------------------------------


def test_the_anchor_rule_is_githubs() -> None:
    assert slug("What happens when…") == "what-happens-when"
    ray = 'Several hosts (`[cluster] backend = "ray"`)'
    assert slug(ray) == "several-hosts-cluster-backend--ray"
    assert slug("GPU verification (run where a GPU is lent)") == (
        "gpu-verification-run-where-a-gpu-is-lent"
    )
    assert anchors("# A\n## A\n```\n# not a heading\n```\n") == {"a", "a-1"}


@pytest.mark.parametrize("page", pages(), ids=page_id)
def test_every_relative_link_resolves(page: Path) -> None:
    text = page.read_text()
    broken = []
    for target in links(text):
        if re.match(r"[a-z][a-z0-9+.-]*:", target, re.I):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest.read_text()):
            broken.append(f"{target} (no such heading)")
    assert broken == [], f"{page_id(page)}: {broken}"


# ---- configuration keys --------------------------------------------------------------------

# A configuration with every table, each once: the probe adds an unknown key to one table at a
# time, and config.py's own refusal ("unknown key ... (known: a, b, c)") names the keys it
# accepts there. Nothing here lists a key by hand.
FULL_CONFIG: dict[str, Any] = {
    "state_dir": "state",
    "modes": {"light": {"num_envs": 2, "batch_size": 32, "max_concurrent": 1}},
    "games": [{"name": "cartpole", "env_id": "CartPole-v1", "total_steps": 1000}],
    "restart": {},
    "watchdog": {},
    "stability": {},
    "gpu": {},
    "mirror": {"url": "s3://bucket/prefix"},
    "cluster": {},
    "spare": {},
    "metrics": {},
    "preemption": {},
    "tracking": {},
    "hooks": [{"on": ["fatal"], "command": ["/bin/true"]}],
}
PROBE = "zz_not_a_key"


def _refusal(data: dict[str, Any], tmp: Path) -> str:
    try:
        parse_config(data, tmp / "rlsup.toml", check_devices=False)
    except ConfigError as exc:
        return str(exc)
    raise AssertionError(f"config.py accepted {PROBE!r}")


def _known(data: dict[str, Any], tmp: Path) -> list[str]:
    message = _refusal(data, tmp)
    m = re.search(r"unknown key.*\(known: ([^)]*)\)", message)
    assert m, f"not an unknown-key refusal: {message}"
    return [k.strip() for k in m.group(1).split(",")]


def accepted_keys(tmp: Path) -> set[str]:
    """Every key config.py accepts, as `key` (top level) or `table.key`."""
    parse_config(copy.deepcopy(FULL_CONFIG), tmp / "rlsup.toml", check_devices=False)  # valid
    out: set[str] = set()
    for key in _known({**copy.deepcopy(FULL_CONFIG), PROBE: 1}, tmp):
        data = copy.deepcopy(FULL_CONFIG)
        value = data.get(key)
        if isinstance(value, list):  # [[games]], [[hooks]]: an array of tables
            value[0][PROBE] = 1
        elif isinstance(value, dict) and value and all(isinstance(v, dict) for v in value.values()):
            next(iter(value.values()))[PROBE] = 1  # [modes.NAME]: a table of tables
        elif isinstance(value, dict):
            value[PROBE] = 1
        else:  # a top-level key, or a table FULL_CONFIG lacks
            data[key] = {PROBE: 1}
            table = "unknown key" in _refusal(data, tmp)
            assert not table, f"add the table [{key}] to FULL_CONFIG"
            out.add(key)
            continue
        out |= {f"{key}.{k}" for k in _known(data, tmp)}
    # A command game (`command` instead of `env_id`/`algo`) is a [[games]] table with keys of
    # its own: probed the same way.
    data = copy.deepcopy(FULL_CONFIG)
    data["games"] = [{"name": "mine", "command": ["/bin/true"], PROBE: 1}]
    out |= {f"games.{k}" for k in _known(data, tmp)}
    return out


def documented_keys(text: str) -> set[str]:
    """The first column of every `| key | ...` table, normalised to `key` / `table.key`:
    `[restart] backoff_base_s`, `[[hooks]] on`, `restart.budget`, `modes.*.num_envs`, and
    `[modes.NAME]` (a table of tables, no key of its own)."""
    out: set[str] = set()
    for table in tables(text, "key"):
        for row in table:
            for name in re.findall(r"`([^`]+)`", row[0]):
                name = name.strip()
                if re.fullmatch(r"\[\[?[a-z_]+(?:\.[A-Z*]+)?\]\]?", name):
                    continue  # a table heading alone: its keys are the rows
                # "[restart] budget", "[[hooks]] on", "restart.budget", "modes.*.num_envs"
                m = re.fullmatch(r"\[\[?([a-z_]+)\]\]?\s+([a-z_]+)", name) or re.fullmatch(
                    r"([a-z_]+)\.(?:\*\.)?([a-z_]+)", name
                )
                if m:
                    out.add(f"{m.group(1)}.{m.group(2)}")
                elif re.fullmatch(r"[a-z_]+", name):
                    out.add(name)
                else:
                    raise AssertionError(f"docs/configuration.md: cannot read key {name!r}")
    return out


def test_the_key_reader_reads_every_form() -> None:
    text = (
        "| key | default | meaning |\n|---|---|---|\n"
        "| `state_dir` | x | y |\n| `[modes.NAME]` | x | y |\n| `modes.*.num_envs` | x | y |\n"
        "| `[[games]] name` | x | y |\n| `games.env_id` | x | y |\n"
        "| `[restart] budget` | x | y |\n| `mirror.concurrency` / `mirror.chunk_mb` | x | y |\n"
        "\n| command | what |\n|---|---|\n| `not_a_key` | z |\n"
    )
    assert documented_keys(text) == {
        "state_dir",
        "modes.num_envs",
        "games.name",
        "games.env_id",
        "restart.budget",
        "mirror.concurrency",
        "mirror.chunk_mb",
    }


def test_configuration_md_documents_exactly_the_accepted_keys(tmp_path: Path) -> None:
    accepted = accepted_keys(tmp_path)
    assert {"state_dir", "modes.num_envs", "games.env_id", "hooks.on", "mirror.url"} <= accepted
    documented = documented_keys((DOCS / "configuration.md").read_text())
    assert accepted - documented == set(), "accepted by config.py, not in docs/configuration.md"
    assert documented - accepted == set(), "in docs/configuration.md, not accepted by config.py"


# ---- the status --json schema --------------------------------------------------------------


def schema_fields() -> set[str]:
    """Every field of the status document as a path: `games`, `games[].name`,
    `mode.scopes[].scope`, `games[].last_error.kind`, walked from StatusDoc's type hints."""

    def records(t: Any, in_list: bool = False) -> list[tuple[type, bool]]:
        if typing.is_typeddict(t):
            return [(t, in_list)]
        origin = typing.get_origin(t)
        if origin is list:
            return [r for a in typing.get_args(t) for r in records(a, True)]
        if origin in (typing.Union, types.UnionType):
            return [r for a in typing.get_args(t) for r in records(a, in_list)]
        return []

    def walk(record: type, prefix: str) -> set[str]:
        out: set[str] = set()
        for name, hint in typing.get_type_hints(record).items():
            out.add(prefix + name)
            for sub, in_list in records(hint):
                out |= walk(sub, f"{prefix}{name}{'[]' if in_list else ''}.")
        return out

    return walk(status_schema.StatusDoc, "")


def documented_fields(text: str) -> set[str]:
    out: set[str] = set()
    for table in tables(text, "field"):
        for row in table:
            m = re.fullmatch(r"`([^`]+)`", row[0])
            assert m, f"docs/observability.md: a field row names one field in code: {row[0]!r}"
            out.add(m.group(1))
    return out


def test_observability_md_documents_exactly_the_status_fields() -> None:
    fields = schema_fields()
    assert {"schema", "games", "games[].name", "mode.scopes[].pinned"} <= fields
    documented = documented_fields((DOCS / "observability.md").read_text())
    assert fields - documented == set(), "in the schema, not in docs/observability.md"
    assert documented - fields == set(), "in docs/observability.md, not in the schema"
