"""docs/benchmarks.md shows `python -m benchmarks --list`: the block must be what the command prints now (a
section added to benchmarks/cli.py and not to the page was missing from it), and the page and the entry point's
error name every section that takes options of its own."""
import contextlib
import io
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_the_documented_section_list_is_the_commands_output():
    sys.path.insert(0, str(REPO))
    from benchmarks.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["--list"]) == 0
    page = (REPO / "docs" / "benchmarks.md").read_text()
    block = re.search(r"```\n\$ python -m benchmarks --list\n(.*?)```", page, re.S)
    assert block, "docs/benchmarks.md lost its `$ python -m benchmarks --list` block"
    assert block.group(1) == out.getvalue()
    names = [line.split()[0] for line in out.getvalue().splitlines()]
    assert len(names) == len(set(names)) >= 20
    lines = out.getvalue().splitlines()  # the help texts start in one column
    assert len({len(line) - len(line[len(name):].lstrip(" 0123456789")) for line, name in zip(lines, names)}) == 1


def test_the_sections_taking_their_own_options_are_all_named(capsys):
    sys.path.insert(0, str(REPO))
    import pytest

    from benchmarks.cli import SECTIONS, parse

    takers = {s.name for s in SECTIONS if s.own_options}
    page = (REPO / "docs" / "benchmarks.md").read_text()
    said = re.search(r"takes its own \(([^)]*)\)", page).group(1)
    assert set(re.findall(r"`([^`]+)`", said)) == takers
    with pytest.raises(SystemExit):
        parse(["--only", "packing,restore", "--runners", "threads"])
    err = capsys.readouterr().err
    assert all(name in err for name in takers), err


def test_no_write_leaves_docs_img_alone(tmp_path, monkeypatch):
    """`python -m benchmarks --only curricula --no-write` (and `--quick` without `--write`) prints its summary and
    writes no plot into docs/img/ (it wrote docs/img/curriculum.png whatever the flags)."""
    sys.path.insert(0, str(REPO))
    from benchmarks.cli import main

    monkeypatch.chdir(tmp_path)  # the plot's default path is relative: docs/img/curriculum.png here
    (tmp_path / "docs" / "img").mkdir(parents=True)
    for flags in (["--no-write"], ["--quick"]):
        assert main(["--only", "curricula", *flags, "--steps", "5"]) == 0
        assert not (tmp_path / "docs" / "img" / "curriculum.png").exists(), flags
    assert main(["--only", "curricula", "--quick", "--write", "--steps", "5"]) == 0
    assert (tmp_path / "docs" / "img" / "curriculum.png").stat().st_size > 0
