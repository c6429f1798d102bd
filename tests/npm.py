"""One `npm ci` at a time per client directory.

`make test` runs two pytest passes side by side (noida and tansu), each over xdist processes, in one checkout: two
`npm ci` in the same directory delete each other's node_modules half-way (seen: ENOTEMPTY in one, "Cannot find
module kafkajs" in the other). The lock is held across the "is it installed?" check and the install, so the second
comer finds the first one's install done.
"""

from __future__ import annotations

import contextlib
import fcntl
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def install_lock(client_dir: Path) -> Iterator[None]:
    with (client_dir / ".npm-install.lock").open("a") as f:  # ignored by git (see .gitignore)
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
