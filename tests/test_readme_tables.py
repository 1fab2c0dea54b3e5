"""The README's cost tables are what bench/readme_tables.py writes from bench/results/: a figure in a
table cannot differ from the run that produced it."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))  # bench/ is no package
import readme_tables

REPO = readme_tables.REPO


def test_every_readme_table_matches_its_results_file(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("BENCH_RESULTS", raising=False)
    text = (REPO / "README.md").read_text()
    names = readme_tables.BLOCK.findall(text)
    assert {name for _, name, _, _ in names} >= {"nginx_load", "http_load"}
    assert readme_tables.main(["--check"]) == 0


def test_a_changed_figure_is_caught_then_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    results = tmp_path / "results"
    results.mkdir()
    shutil.copy(REPO / "bench" / "results" / "nginx_load.json", results)
    monkeypatch.setenv("BENCH_RESULTS", str(results))
    readme = tmp_path / "README.md"
    readme.write_text(
        "before\n\n<!-- results:nginx_load -->\n"
        + readme_tables.render("nginx_load")
        + "<!-- /results:nginx_load -->\n\nafter\n"
    )
    assert readme_tables.main(["--check", "--readme", str(readme)]) == 0

    document = json.loads((results / "nginx_load.json").read_text())
    document["figures"]["loads"][0]["ratio"] = 0.123
    document["date"] = "2030-01-02T03:04:05+00:00"
    (results / "nginx_load.json").write_text(json.dumps(document))
    assert readme_tables.main(["--check", "--readme", str(readme)]) == 1
    assert "| 0.123 |" not in readme.read_text()  # --check writes nothing

    assert readme_tables.main(["--readme", str(readme)]) == 0
    text = readme.read_text()
    assert "| 0.123 |" in text and "on 2030-01-02" in text
    assert text.startswith("before\n\n") and text.endswith("\n\nafter\n")
    assert readme_tables.main(["--check", "--readme", str(readme)]) == 0


def test_a_block_no_table_renders_is_an_error(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text("<!-- results:no_such_bench -->\n| x |\n<!-- /results:no_such_bench -->\n")
    with pytest.raises(SystemExit, match="no_such_bench"):
        readme_tables.main(["--check", "--readme", str(readme)])
