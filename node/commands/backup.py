"""backup: a consistent copy of the whole home, itself a home (docs/operations.md, "Backup").

The copy is taken on the node that holds the home (through serve when it runs), so it needs no
second writer: SQLite's online backup copies the storage file as one snapshot, then the key
files, config.yaml and the API token are copied beside it with the same 0600 modes. A backup
directory is a complete home: `memmesh --home DEST status` reads it, and restoring is putting it
where the home was (while no serve runs there).
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

from pydantic import Field, field_validator

from auth.errors import MemmeshError
from node.commands.params import Cli, Params
from node.commands.registry import command
from node.commands.result import Result
from node.home import KEYS_DIR, STORAGE_FILE

if TYPE_CHECKING:
    from node.library import Node

# Besides the storage file and keys/: what a home holds that a restore needs.
SIDE_FILES = ("config.yaml", "api.token")


class BackupError(MemmeshError):
    """The backup could not be written; the destination is left as it was, or removed."""


class Backup(Params):
    dest: Annotated[str, Cli(positional=True, metavar="DIR", path=True), Field(
        description="a directory that does not exist yet (or is empty): it becomes a copy of the home")]

    @field_validator("dest")
    @classmethod
    def _absolute(cls, value: str) -> str:
        # The CLI makes a relative path absolute where the user stands; another caller (the HTTP
        # API) must say where it means, since serve's working directory is nobody's business.
        if not os.path.isabs(value):
            raise ValueError(f"should be an absolute path (got {value!r})")
        return value


@command("backup", Backup, "copy the whole home (storage, keys, config) to a new directory, consistently")
def backup(node: "Node", p: Backup) -> Result:
    dest = Path(p.dest)
    home = Path(node.home).absolute()
    if dest.absolute() == home or home in dest.absolute().parents:
        raise BackupError(f"{dest} is inside the home {home}; back up to a directory outside it")
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise BackupError(f"{dest} exists and is not an empty directory; name a new one")
    created = not dest.exists()
    try:
        dest.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(dest, 0o700)  # it holds private keys
        node.storage.backup_to(dest / STORAGE_FILE)
        os.chmod(dest / STORAGE_FILE, 0o600)
        (dest / KEYS_DIR).mkdir(mode=0o700)
        keys = sorted(f for f in (home / KEYS_DIR).iterdir() if f.is_file())
        for f in keys:
            _copy_private(f, dest / KEYS_DIR / f.name)
        side = [name for name in SIDE_FILES if (home / name).is_file()]
        for name in side:
            _copy_private(home / name, dest / name)
    except BaseException:
        shutil.rmtree(dest, ignore_errors=True) if created else _empty(dest)
        raise
    size = (dest / STORAGE_FILE).stat().st_size
    data = {"dest": str(dest), "databases": len(node.database_ids()), "keys": len(keys), "bytes": size,
            "files": [STORAGE_FILE, *(f"{KEYS_DIR}/{f.name}" for f in keys), *side]}
    return Result(data, f"backed up {home} to {dest}: {data['databases']} databases, {len(keys)} keys, "
                        f"{size:,} bytes of storage\n"
                        f"restore: stop serve, put {dest} where the home was, start serve and sync "
                        "before agents write (docs/operations.md)")


def _copy_private(src: Path, dst: Path) -> None:
    fd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as out, open(src, "rb") as f:
        shutil.copyfileobj(f, out)


def _empty(d: Path) -> None:
    for child in d.iterdir():
        shutil.rmtree(child) if child.is_dir() else child.unlink()
