"""The documentation serves its reader: a README short enough to read (at most 300 lines, none over 120 columns, as
the docs/ pages), relative links in the README, docs/ and model_cards/ that lead to a file, a results table whose
every row links the card of its run in model_cards/, and no word "session" (as in a work session) in the README,
docs/, model_cards/ or the shipped configs: they speak of the project, its runs and configs."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
MAX_README_LINES, MAX_COLUMNS = 300, 120

INLINE_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")  # [text](target), ![alt](target)
REFERENCE_DEFINITION = re.compile(r"^ {0,3}\[([^\]]+)\]:\s*<?(\S+?)>?(?:\s+.*)?$")  # [label]: target
REFERENCE_USE = re.compile(r"\[([^\]]*)\](?:\[([^\]]*)\])?")  # [text][label], [label][] or [label]
# "session" in the sense of a work session; pytest's session-scoped fixtures are another thing.
SESSION = re.compile(r"\bsessions?\b(?!-scoped)", re.IGNORECASE)
PYTEST_SESSION = re.compile(r"""scope\s*=\s*["']session["']|session-scoped|sessionstart|sessionfinish""",
                            re.IGNORECASE)


def prose(text: str) -> str:
    """The text without its fenced code blocks (a link-like string in code is not a link)."""
    kept, fenced = [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            kept.append("")
            continue
        kept.append("" if fenced else line)
    return "\n".join(kept)


def without_code_spans(line: str) -> str:
    return re.sub(r"`[^`]*`", "", line)


def reference_definitions(text: str) -> dict[str, str]:
    return {m.group(1).strip().lower(): m.group(2)
            for line in prose(text).splitlines() if (m := REFERENCE_DEFINITION.match(line))}


def link_targets(text: str) -> list[str]:
    """Every link target of a Markdown text: inline links and images, and reference definitions."""
    body = prose(text)
    targets = [m.group(1) for line in body.splitlines() for m in INLINE_LINK.finditer(without_code_spans(line))]
    return targets + list(reference_definitions(text).values())


def is_relative(target: str) -> bool:
    return not re.match(r"^[a-z][a-z0-9+.-]*:", target, re.IGNORECASE) and not target.startswith("#")


def markdown_files() -> list[Path]:
    return [README, *sorted((ROOT / "docs").rglob("*.md")), *sorted((ROOT / "model_cards").glob("*.md"))]


def test_readme_is_short_and_narrow():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= MAX_README_LINES, f"README.md has {len(lines)} lines, at most {MAX_README_LINES}"
    for page in [README, *sorted((ROOT / "docs").glob("*.md"))]:
        wide = [f"{page.relative_to(ROOT)}:{number} ({len(line)} columns)"
                for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1)
                if len(line) > MAX_COLUMNS]
        assert not wide, f"lines over {MAX_COLUMNS} columns: {wide}"


def test_readme_keeps_the_blocks_ci_runs():
    text = README.read_text(encoding="utf-8").splitlines()
    for marker in ("<!-- ci: install -->", "<!-- ci: main -->", "<!-- ci: test -->", "<!-- ci: browser -->"):
        assert marker in text, marker
        assert text[text.index(marker) + 1].startswith("```bash"), f"{marker} must be followed by a ```bash block"


def test_every_relative_link_leads_to_a_file():
    broken = []
    for page in markdown_files():
        for target in link_targets(page.read_text(encoding="utf-8")):
            if not is_relative(target):
                continue
            path = target.split("#", 1)[0]
            if path and not (page.parent / path).exists():
                broken.append(f"{page.relative_to(ROOT)} -> {target}")
    assert not broken, f"links to files that do not exist: {broken}"


def results_table_rows(text: str) -> list[str]:
    section = text.split("\n## Results", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("|")]
    assert len(rows) > 2, "the README's Results section has no table"
    return rows[2:]  # below the header and its --- line


def test_results_table_links_a_model_card_per_row():
    text = README.read_text(encoding="utf-8")
    definitions = reference_definitions(text)
    for row in results_table_rows(text):
        targets = [m.group(1) for m in INLINE_LINK.finditer(row)]
        for m in REFERENCE_USE.finditer(INLINE_LINK.sub("", row)):
            label = (m.group(2) or m.group(1)).strip().lower()
            if label in definitions:
                targets.append(definitions[label])
        cards = [t for t in targets if t.startswith("model_cards/") and t.endswith(".md")]
        assert cards, f"a results row without a link to its card in model_cards/: {row}"
        for card in cards:
            assert (ROOT / card).is_file(), f"{card} (linked from the results table) does not exist"


def test_model_cards_are_one_per_shipped_config():
    configs = {path.stem for path in (ROOT / "vaswani_mt" / "configs").glob("*.yaml")}
    cards = {path.stem for path in (ROOT / "model_cards").glob("*.md")} - {"README"}
    assert cards <= configs, f"cards in model_cards/ that are not named after a shipped config: {cards - configs}"


def test_no_work_sessions_in_the_product():
    files = [README, *(ROOT / "docs").rglob("*.md"), *(ROOT / "model_cards").rglob("*.md"),
             *(ROOT / "vaswani_mt" / "configs").glob("*.yaml")]
    found = []
    for path in files:
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if SESSION.search(PYTEST_SESSION.sub("", line)):
                found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not found, "'session' in the product (say what the run or config is instead):\n" + "\n".join(found)
