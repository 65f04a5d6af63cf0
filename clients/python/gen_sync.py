"""Generates the blocking client, ``permit/_sync.py``, from the asyncio one, ``permit/aio.py``.

The client is written once, for asyncio; the blocking one is the same code with ``async`` and
``await`` taken out (as ``unasync`` does for httpcore): run ``python gen_sync.py`` after
changing ``permit/aio.py``; ``tests/test_docs.py`` fails while ``_sync.py`` is out of date.
What threads do differently from tasks (waiting, background work, races) is behind the same
names in ``permit/_async_io.py`` and ``permit/_sync_io.py``: the generated module imports the
latter. The rules below are applied in order to the whole text.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import List, Tuple

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "permit" / "aio.py"
TARGET = HERE / "permit" / "_sync.py"

DOC = '''"""The blocking client: threads, a keepalive thread per session, guards as context managers.

Generated from ``permit/aio.py`` by ``gen_sync.py``: edit that file, then run the script.
"""'''

RULES: List[Tuple[str, str]] = [
    # The module docstring.
    (r'\A""".*?"""', DOC),
    # What differs between tasks and threads.
    (r"\bimport asyncio\n", ""),
    (r"\b_async_io\b", "_sync_io"),
    (r"^from \._sync_io import Pending\n", ""),
    (r"^    \"Pending\",\n", ""),
    # ``Pending`` is what makes a coroutine an async context manager; a blocking call returns the
    # object itself.
    (r"\bPending\[(\w+)\]", r"\1"),
    (r"\breturn Pending\((.*)\)$", r"return \1"),
    (r"\basyncio\.Event\b", "threading.Event"),
    (r"\basyncio\.sleep\b", "time.sleep"),
    (r'getLogger\("permit\.aio"\)', 'getLogger("permit")'),
    # The coroutine syntax and its protocols.
    (r"\basync def\b", "def"),
    (r"\basync with\b", "with"),
    (r"\basync for\b", "for"),
    (r"\bawait ", ""),
    (r"\b__aenter__\b", "__enter__"),
    (r"\b__aexit__\b", "__exit__"),
    (r"\b__aiter__\b", "__iter__"),
    (r"\b__anext__\b", "__next__"),
    (r"\bStopAsyncIteration\b", "StopIteration"),
    (r"\bAsyncIterator\b", "Iterator"),
    # httpx's two clients.
    (r"\bhttpx\.AsyncClient\b", "httpx.Client"),
    (r"\bhttpx\.AsyncHTTPTransport\b", "httpx.HTTPTransport"),
    (r"\baclose\b", "close"),
    (r"\baread\b", "read"),
    (r"\baiter_lines\b", "iter_lines"),
    # The docstrings and comments.
    (r"Use it from one event loop; share one per loop\.", "Thread-safe; share one per process."),
    (r"\ban ``threading\.Event``", "a ``threading.Event``"),
    (r"\ban(\s+)async context(\s+)manager\b", r"a\1context\2manager"),
    (r"\basync (iterator|context(\s+)manager)\b", r"\1"),
    (r"\bbackground asyncio task\b", "background thread"),
    (r"\btask\b", "thread"),
]


def render() -> str:
    """The text of ``permit/_sync.py`` for the current ``permit/aio.py``."""
    text = SOURCE.read_text()
    for pattern, replacement in RULES:
        text = re.sub(pattern, replacement, text, flags=re.M | re.S if pattern.startswith(r"\A") else re.M)
    return text


if __name__ == "__main__":
    TARGET.write_text(render())
    print("wrote", TARGET)
