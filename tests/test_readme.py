"""README's quickstart is code a user pastes: it must run and learn."""

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


@pytest.mark.slow
def test_quickstart_runs_and_learns():
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.S)
    quickstart = blocks[0]
    assert "model.fit" in quickstart
    namespace = {}
    exec(compile(quickstart, "README quickstart", "exec"), namespace)
    assert namespace["model"].history.history["accuracy"][-1] > 0.8
