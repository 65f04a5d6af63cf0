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


def test_readme_policies_section_runs_as_is(server: Server) -> None:
    readme = (HERE / "README.md").read_text()
    section = readme.split("\n## Rate limits, lock-delay and groups\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert len(blocks) == 2, "a blocking and an asyncio example in the README's policies section"
    outputs = []
    for block in blocks:
        code = block.replace("http://127.0.0.1:7376", server.url)
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        outputs.append(done.stdout)
    assert "5.0 8 [('team-a', 2)]" in outputs[0] and "taken: " in outputs[0], outputs[0]
    # What the examples left: the rate removed, the other policies kept.
    api = httpx.get(server.url + "/v1/semaphores/api.example", timeout=5.0, trust_env=False).json()
    gpu = httpx.get(server.url + "/v1/semaphores/gpu.pool", timeout=5.0, trust_env=False).json()
    rated = httpx.get(server.url + "/v1/semaphores/api.async", timeout=5.0, trust_env=False).json()
    assert ("rate" not in api, gpu["lock_delay_ms"], gpu["group_max"], gpu["held"]) == (True, 5000, 8, 0)
    assert (rated["rate"]["permits"], rated["rate"]["per_ms"]) == (100, 60000)
