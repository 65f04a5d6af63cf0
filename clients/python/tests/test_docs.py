"""API.md is generated from the docstrings and up to date; the README quick start runs."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from conftest import Server

HERE = Path(__file__).resolve().parents[1]


def test_api_reference_is_up_to_date() -> None:
    sys.path.insert(0, str(HERE))
    import gen_api

    assert (HERE / "API.md").read_text() == gen_api.render(), "API.md is stale: run python clients/python/gen_api.py"


def test_readme_quick_start_runs_as_is(server: Server) -> None:
    readme = (HERE / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", readme, re.S)
    assert blocks, "no python block in the README"
    quick = blocks[0].replace("http://127.0.0.1:7376", server.url)
    done = subprocess.run([sys.executable, "-c", quick], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
