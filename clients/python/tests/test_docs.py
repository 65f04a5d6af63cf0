"""API.md and the blocking client are generated and up to date; the README quick start runs."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import httpx

from conftest import Server

HERE = Path(__file__).resolve().parents[1]


def test_api_reference_is_up_to_date() -> None:
    sys.path.insert(0, str(HERE))
    import gen_api

    assert (HERE / "API.md").read_text() == gen_api.render(), "API.md is stale: run python clients/python/gen_api.py"


def test_sync_client_is_generated_from_the_asyncio_one() -> None:
    sys.path.insert(0, str(HERE))
    import gen_sync

    assert gen_sync.TARGET.read_text() == gen_sync.render(), (
        "permit/_sync.py is stale: edit permit/aio.py, then run python clients/python/gen_sync.py"
    )


def test_readme_quick_start_runs_as_is(server: Server) -> None:
    readme = (HERE / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", readme, re.S)
    assert len(blocks) >= 2, "no blocking and asyncio quick start in the README"
    # The blocking quick start, then the asyncio one.
    for block in blocks[:2]:
        quick = block.replace("http://127.0.0.1:7376", server.url)
        done = subprocess.run([sys.executable, "-c", quick], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr


def test_readme_queue_section_runs_as_is(server: Server) -> None:
    readme = (HERE / "README.md").read_text()
    section = readme.split("\n## Work queues\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert len(blocks) == 2, "a blocking and an asyncio example in the README's queue section"
    for block in blocks:
        code = block.replace("http://127.0.0.1:7376", server.url)
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
    # What the blocking example did: ada's and bob's mails acked, eve's nacked twice.
    eve = httpx.get(server.url + "/v1/queues/emails/items", timeout=5.0, trust_env=False).json()["items"]
    assert [(i["payload"], i["state"], i["attempt"], i["last_error"]) for i in eve] == [
        ({"to": "eve@example.com"}, "delayed", 2, "smtp still down")
    ]
