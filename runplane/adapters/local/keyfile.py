"""Secrets sealed under a key file: the stack on one machine (and an Azure stack set to ``file:PATH``).

The file holds 32 random bytes, made once (``O_CREAT | O_EXCL``, mode 0600, in a directory of this
user's that no one else may write in; written whole, then linked to its name, which never replaces
a file there) and never rewritten: losing or replacing it loses every
secret sealed under it, so ``runplane serve backup`` copies it with the database. A file that
group or others may read, or that is not this user's, is refused with a message saying so.

A value's data key is wrapped by AES-256-GCM under the file's key, with the value's context
(scope and name) as associated data, like the value itself (``envelope.py``): a sealed value
moved to another scope or name, or under another stack's key, does not open. The key's id
(``file:`` and a prefix of the key's SHA-256) tells a value sealed under another key file apart
before anything is tried.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import stat
import threading
from collections.abc import Mapping
from pathlib import Path

from runplane.adapters.envelope import NONCE_BYTES, new_data_key, open_with, seal_with, unb64
from runplane.adapters.local.db import not_private, state_path
from runplane.domain.errors import Misconfigured
from runplane.domain.secrets import Sealed, SecretUnavailable, associated_data

__all__ = ["KEY_BYTES", "KEY_FILE", "KeyFile", "KeyFileOpener", "KeyFileSealer", "key_file_path"]

KEY_FILE = "secrets.key"
"""The key file's name in the state directory, unless ``secrets_key`` names another."""
KEY_BYTES = 32
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
_MAKE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def key_file_path(setting: str, state_dir: str | os.PathLike[str]) -> Path:
    """The key file a stack's ``secrets_key`` names (``PATH`` or ``file:PATH``), or ``secrets.key``
    in its state directory when it names none."""
    path = setting.removeprefix("file:").strip()
    return Path(path).expanduser().absolute() if path else state_path(state_dir) / KEY_FILE


class KeyFile:
    """The key in ``path``, read once per process (made first when ``make`` and it is missing)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(os.fspath(path)).expanduser().absolute()
        self._key: bytes | None = None
        self._lock = threading.Lock()

    def key(self, make: bool) -> bytes:
        """The key; Misconfigured (saying why, naming the path) when it cannot be used."""
        with self._lock:
            if self._key is None:
                if make:
                    self._make()
                self._key = self._read()
            return self._key

    def _make(self) -> None:
        folder = self.path.parent
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        why = not_private(folder.stat())
        if why is not None:
            raise Misconfigured(f"the secrets key file's directory {folder} is refused: {why}")
        if self.path.exists() or self.path.is_symlink():
            return  # made before, by this process or another: never rewritten
        # written whole under a name of its own, then linked to its name (which fails when another
        # process linked its key first): no reader ever sees a key file half written
        draft = folder / f".{self.path.name}.{os.getpid()}.{secrets.token_hex(4)}"
        try:
            fd = os.open(draft, _MAKE_FLAGS, 0o600)
            try:
                os.write(fd, os.urandom(KEY_BYTES))
                os.fsync(fd)
            finally:
                os.close(fd)
            with contextlib.suppress(FileExistsError):
                os.link(draft, self.path, follow_symlinks=False)
        except OSError as e:
            raise Misconfigured(f"the secrets key file {self.path} cannot be made: {e.strerror}") from e
        finally:
            with contextlib.suppress(OSError):
                draft.unlink()
        with contextlib.suppress(OSError):  # the file's name too survives a crash
            dir_fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)

    def _read(self) -> bytes:
        try:
            fd = os.open(self.path, _READ_FLAGS)
        except FileNotFoundError:
            raise Misconfigured(
                f"the secrets key file {self.path} does not exist: the secrets sealed under it cannot be "
                "opened (restore it from the backup that holds it)"
            ) from None
        except OSError as e:
            raise Misconfigured(f"the secrets key file {self.path} cannot be read: {e.strerror}") from e
        try:
            found = os.fstat(fd)
            if not stat.S_ISREG(found.st_mode):
                raise Misconfigured(f"the secrets key file {self.path} is not a regular file")
            if found.st_uid != os.geteuid():
                raise Misconfigured(
                    f"the secrets key file {self.path} is refused: it is owned by another user (uid {found.st_uid})"
                )
            if found.st_mode & 0o077:
                raise Misconfigured(
                    f"the secrets key file {self.path} is refused: other users may read or write it (mode "
                    f"{stat.S_IMODE(found.st_mode):04o}); make it 0600 (chmod 600 {self.path})"
                )
            data = os.read(fd, KEY_BYTES + 1)
        finally:
            os.close(fd)
        if len(data) != KEY_BYTES:
            raise Misconfigured(f"the secrets key file {self.path} does not hold a key ({KEY_BYTES} bytes)")
        return data


def key_id(key: bytes) -> str:
    """What a value sealed under ``key`` records of it: not the key, a short digest of it."""
    return "file:" + hashlib.sha256(key).hexdigest()[:16]


class KeyFileSealer:
    """Seals values under the key file (made at the first seal when it is missing)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.file = KeyFile(path)

    def ready(self) -> str:
        """Make the key file now when it is missing (a stack does at its start, so that a key it
        cannot use is said then, and its backups hold the key); its key's id. Misconfigured: unusable."""
        return key_id(self.file.key(make=True))

    def seal(self, value: bytes, context: Mapping[str, str]) -> Sealed:
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM  # the stack's extras (envelope.py)

        key = self.file.key(make=True)
        data_key = new_data_key()
        nonce = os.urandom(NONCE_BYTES)
        wrapped = nonce + AESGCM(key).encrypt(nonce, data_key, associated_data(dict(context)))
        return seal_with(data_key, wrapped, key_id(key), value, context)


class KeyFileOpener:
    """Opens values sealed under the key file; never makes it. SecretUnavailable when the file is
    missing or refused, or the value was sealed under another key, for another context, or altered."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.file = KeyFile(path)

    def open(self, sealed: Sealed, context: Mapping[str, str]) -> bytes:
        from cryptography.exceptions import InvalidTag
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM

        try:
            key = self.file.key(make=False)
        except Misconfigured as e:
            raise SecretUnavailable(str(e)) from None
        if sealed.key_id != key_id(key):
            raise SecretUnavailable(f"the value was sealed under another key ({sealed.key_id[:40]}), not this stack's")
        wrapped = unb64(sealed.wrapped_key, "wrapped key")
        try:
            data_key = AESGCM(key).decrypt(wrapped[:NONCE_BYTES], wrapped[NONCE_BYTES:], associated_data(dict(context)))
        except (InvalidTag, ValueError):
            raise SecretUnavailable("the value's key was not wrapped for this secret, or was altered") from None
        return open_with(data_key, sealed, context)
