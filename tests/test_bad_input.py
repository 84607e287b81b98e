"""A schedule file built to break the reader is one line naming the file and the problem."""

from __future__ import annotations

from pathlib import Path

import pytest

from beatless.cli.command import main
from beatless.cli.loader import MAX_DEPTH

HEAD = 'namespace = "deep"\n[[entry]]\nname = "a"\ntask = "t"\nevery = "1m"\n'


@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 1_000, 100_000])
@pytest.mark.parametrize("nest", ["array", "table"])
def test_a_schedule_nested_deep_is_one_line_naming_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], depth: int, nest: str
) -> None:
    value = "[" * depth + "]" * depth if nest == "array" else "{a = " * depth + "1" + "}" * depth
    path = tmp_path / "schedule.toml"
    path.write_text(f"{HEAD}kwargs = {{k = {value}}}\n")

    assert main(["check", str(path)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert len(err.splitlines()) == 1, err[:2_000]
    assert str(path) in err
    assert "nested" in err
    assert f"at most {MAX_DEPTH}" in err
    assert len(err) < 500


def test_a_value_nested_as_deep_as_allowed_is_read(tmp_path: Path) -> None:
    inner = "[" * (MAX_DEPTH - 3) + "]" * (MAX_DEPTH - 3)  # entry, [0], kwargs, k: 3 above
    path = tmp_path / "schedule.toml"
    path.write_text(f"{HEAD}kwargs = {{k = {inner}}}\n")
    assert main(["check", str(path)]) == 0
