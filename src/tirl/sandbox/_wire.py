"""Framing shared by the parent, the zygote and the session processes.

Session sockets are byte streams carrying frames of a 4-byte big-endian length followed by that
many bytes of UTF-8 JSON (never pickle: a session's replies are untrusted). The control socket
between parent and zygote is SOCK_SEQPACKET, one JSON object per record, no length prefix.
"""

from __future__ import annotations

import json
import struct
from typing import Any

HEADER = struct.Struct(">I")
MAX_FRAME = 64 << 20  # a frame longer than this means a broken or hostile peer


def encode(msg: dict[str, Any]) -> bytes:
    body = json.dumps(msg, ensure_ascii=False, separators=(",", ":")).encode("utf-8", "replace")
    return HEADER.pack(len(body)) + body


def decode(body: bytes) -> dict[str, Any]:
    msg = json.loads(body.decode("utf-8", "replace"))
    if not isinstance(msg, dict):
        raise ValueError("frame is not a JSON object")
    return msg
