"""Downloads for the data loaders: one file from one URL, checked, never half-written.

`fetch` streams a URL into a unique `.part` file next to its final place (with a tqdm bar),
checks the size and the MD5, and returns the `.part` path; the caller `os.replace`s it onto the
final name, which is atomic. On any failure, Ctrl-C included, the `.part` file is removed.
"""

from __future__ import annotations

import hashlib
import http.client
import logging
import os
import tempfile
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from tqdm import tqdm

log = logging.getLogger("hogwild.data")


def fetch(url: str, dest_dir: Path, name: str, md5: str | None, timeout: float) -> Path:
    """Download url into a .part file in dest_dir and return it; raises on any failure."""
    # A unique temp name, so two runs downloading into the same folder do not collide;
    # os.replace onto the final name afterwards is atomic.
    fd, tmp = tempfile.mkstemp(dir=dest_dir, prefix=f"{name}.", suffix=".part")
    part = Path(tmp)
    try:
        digest = hashlib.md5()
        with os.fdopen(fd, "wb") as out, urllib.request.urlopen(url, timeout=timeout) as response:
            total = int(response.headers.get("Content-Length") or 0) or None
            size = 0
            with tqdm(
                total=total, unit="B", unit_scale=True, unit_divisor=1024, desc=name, leave=False
            ) as bar:
                while chunk := response.read(1 << 16):
                    out.write(chunk)
                    digest.update(chunk)
                    size += len(chunk)
                    bar.update(len(chunk))
        if total is not None and size != total:
            raise OSError(f"connection closed after {size} of {total} bytes")
        if md5 is not None and digest.hexdigest() != md5.lower():
            raise OSError(f"checksum mismatch for {name}")
        return part
    except BaseException:
        # Also on Ctrl-C: never leave a .part file behind.
        part.unlink(missing_ok=True)
        raise


def failure_reason(e: Exception) -> str:
    if isinstance(e, urllib.error.HTTPError):
        return f"HTTP {e.code}"
    if isinstance(e, urllib.error.URLError):
        return str(e.reason)
    return str(e) or type(e).__name__


def from_mirrors(
    file_name: str,
    dest_dir: Path,
    mirrors: Sequence[str],
    md5: str | None,
    timeout: float,
    label: str | None = None,
) -> list[str]:
    """Fetch `file_name` from the first mirror that delivers it into dest_dir/file_name.
    Returns [] on success, else one one-line reason per mirror tried."""
    reasons = []
    for mirror in mirrors:
        url = mirror.rstrip("/") + "/" + file_name
        try:
            part = fetch(url, dest_dir, label or file_name, md5, timeout)
        except (OSError, http.client.HTTPException, ValueError) as e:
            if isinstance(e, urllib.error.HTTPError):
                e.close()  # It holds the error page's open connection.
            # Collapse whitespace: the DataError built from these must stay on one line.
            reason = " ".join(failure_reason(e).split())
            log.debug("could not download %s: %s", url, reason)
            reasons.append(f"{url}: {reason}")
            continue
        os.replace(part, dest_dir / file_name)
        log.info("downloaded %s from %s", dest_dir / file_name, mirror)
        return []
    return reasons or ["data.mirrors is empty"]
