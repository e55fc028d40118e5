"""What the command line accepts: argument types that refuse bad values up front.

argparse turns the ``ArgumentTypeError`` (or ``ValueError``) these raise into a usage
error naming the argument, exit code 2, before anything runs: a timeout or duration
must be a finite number of seconds (``nan``, ``inf`` and negatives are refused), an
LSN must look like ``16/B374D848``, a port fit in 0-65535, a URL be http(s).
"""

from __future__ import annotations

import argparse
import math
import urllib.parse

from tidemark.errors import ConfigError
from tidemark.lsn import Lsn

MAX_WAIT_S = 300.0  # what GET /v1/progress/wait accepts (tidemark.api.server)
MAX_PAGE = 1000  # the most shapes GET /v1/shapes lists at once (tidemark.api.paging)


def positive_seconds(text: str) -> float:
    value = float(text)
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number of seconds")
    return value


def wait_seconds(text: str) -> float:
    value = positive_seconds(text)
    if value > MAX_WAIT_S:
        raise argparse.ArgumentTypeError(
            f"{text!r} is longer than the API waits at once ({MAX_WAIT_S:g} s): wait again"
        )
    return value


def duration(text: str) -> float:
    value = float(text)
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds >= 0")
    return value


def count(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is negative")
    return value


def page_size(text: str) -> int:
    value = int(text)
    if not 1 <= value <= MAX_PAGE:
        raise argparse.ArgumentTypeError(f"{text!r} is not a page size from 1 to {MAX_PAGE}")
    return value


def port(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a TCP port (0-65535)")
    return value


def lsn_text(text: str) -> str:
    try:
        Lsn.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def service_url(text: str) -> str:
    parts = urllib.parse.urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ConfigError(
            f"--url / TIDEMARK_URL {text!r} is not an http(s) URL: give it like "
            "http://127.0.0.1:8765"
        )
    return text


def url_arg(text: str) -> str:
    try:
        return service_url(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
