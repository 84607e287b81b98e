"""``beatless schedule``: the live entries of a fleet from the command line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from beatless.cli.command import main

TOML = """namespace = "clitest"
[[entry]]
name = "nightly"
task = "app.report"
cron = "0 4 * * *"
args = [1]
"""


def test_put_list_delete_revert_and_history_through_the_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    schedule = tmp_path / "live.toml"
    schedule.write_text(TOML)
    fleet = ["--store", f"sqlite:///{tmp_path / 'claims.db'}", "--namespace", "clitest"]

    def run(*args: str) -> object:
        assert main(["schedule", *args, *fleet, "--json"]) == 0
        return json.loads(capsys.readouterr().out)

    assert run("put", str(schedule))["number"] == 1  # type: ignore[index]
    assert [e["name"] for e in run("list")["entries"]] == ["nightly"]  # type: ignore[index]
    assert run("get", "nightly")["args"] == [1]  # type: ignore[index]
    assert run("plan", str(schedule))["changes"] == []  # type: ignore[index]
    assert run("delete", "nightly")["number"] == 2  # type: ignore[index]
    assert run("revert", "--to", "1")["note"] == "revert to 1"  # type: ignore[index]
    assert [r["number"] for r in run("history", "nightly")] == [1, 2, 3]  # type: ignore[union-attr]
    assert run("export")["revision"] == 3  # type: ignore[index]
    assert main(["schedule", "put", str(schedule), *fleet, "--if-revision", "1"]) == 2
    assert "current revision is 3" in capsys.readouterr().err


def test_export_writes_toml_that_put_reads_back_as_the_same_entries(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    schedule = tmp_path / "live.toml"
    schedule.write_text(TOML)
    fleet = ["--store", f"sqlite:///{tmp_path / 'claims.db'}", "--namespace", "clitest"]
    assert main(["schedule", "put", str(schedule), *fleet]) == 0
    capsys.readouterr()

    assert main(["schedule", "export", *fleet]) == 0
    exported = tmp_path / "exported.toml"
    exported.write_text(capsys.readouterr().out)
    assert main(["schedule", "export", *fleet, "--format", "json"]) == 0
    as_json = json.loads(capsys.readouterr().out)
    assert main(["schedule", "plan", str(exported), *fleet, "--json"]) == 0

    assert json.loads(capsys.readouterr().out)["changes"] == []  # the same entries
    assert exported.read_text().startswith("# live entries of namespace 'clitest' at revision 1")
    assert [e["name"] for e in as_json["entries"]] == ["nightly"]
