"""Reading and removing directory trees that a run wrote and may still be changing.

A run is hostile and the agent is root, so below the top nothing here goes by path strings:
every directory is opened relative to its parent's file descriptor with ``O_NOFOLLOW`` (a
directory swapped for a symlink meanwhile is never followed, and a path longer than ``PATH_MAX``
is no obstacle), only the top's file system is entered, and nothing recurses in Python (a tree
a thousand directories deep is an ordinary input). Walks are bounded in depth, which also
bounds the descriptors they hold open.
"""

from __future__ import annotations

import errno
import os
import stat
import uuid
from collections.abc import Generator
from pathlib import Path

MAX_DEPTH = 256
"""The deepest tree a walk reads: a deeper one cannot be counted (it is no honest output)."""
MAX_LINKS = 40
"""Symlinks followed while opening one output file (the kernel's own limit)."""
MOVE_DEPTH = 64
"""``remove_tree`` moves directories deeper than this up beside the tree and removes them from there."""
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
# what opening a listed entry meets when the run removed or replaced it since it was listed
_CHANGED = frozenset({errno.ENOENT, errno.ENOTDIR, errno.ELOOP})
_OUTSIDE = "symlink out of the output directory"


class Unwalkable(Exception):
    """A tree that cannot be read whole: a directory that cannot be opened or listed, or one
    deeper than the bound. What it holds is unknown."""


class Refused(Exception):
    """An output file that is not uploaded; the message says why."""


def _is_dir(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_dir(follow_symlinks=False)  # from the directory listing: no system call
    except OSError:  # gone meanwhile
        return False


def scan(root: Path | str, max_depth: int = MAX_DEPTH) -> Generator[tuple[str, os.DirEntry[str]], None, None]:
    """Every entry under ``root``, depth first, as (its directory relative to ``root``: ``""``
    or a path ending in ``/``; its ``DirEntry``), where ``entry.stat(follow_symlinks=False)``
    works until the next entry is asked for. Symlinks are never followed and other file systems
    never entered; an entry removed or replaced while the walk goes is passed over. A missing
    ``root`` is an empty tree. Raises Unwalkable. Closing the generator early closes every
    descriptor it holds (at most ``max_depth`` + 1)."""
    try:
        fd = os.open(root, _DIR)
    except FileNotFoundError:
        return
    except OSError as e:
        raise Unwalkable(f"{_short(str(root))}: {e.strerror}") from e
    prefix = ""
    stack: list[tuple[int, str, list[str]]] = []
    try:
        device = os.fstat(fd).st_dev
        while fd >= 0:
            subdirs: list[str] = []
            stack.append((fd, prefix, subdirs))
            try:
                with os.scandir(fd) as listing:
                    for entry in listing:
                        yield prefix, entry
                        if _is_dir(entry):
                            subdirs.append(entry.name)
            except OSError as e:
                raise Unwalkable(f"{_short(prefix or './')}: {e.strerror}") from e
            fd, prefix = _next_dir(stack, device, max_depth)
    finally:
        for held, _, _ in stack:
            os.close(held)


def _next_dir(stack: list[tuple[int, str, list[str]]], device: int, max_depth: int) -> tuple[int, str]:
    """The next directory to list (its descriptor and prefix), closing those done; -1 at the end."""
    while stack:
        parent, prefix, subdirs = stack[-1]
        if not subdirs:
            os.close(parent)
            stack.pop()
            continue
        name = subdirs.pop()
        if len(stack) > max_depth:
            raise Unwalkable(f"{_short(prefix + name)}/ is deeper than {max_depth} directories")
        try:
            child = os.open(name, _DIR, dir_fd=parent)
        except OSError as e:
            if e.errno in _CHANGED:
                continue
            raise Unwalkable(f"{_short(prefix + name)}/: {e.strerror}") from e
        if _device(child) != device:  # another file system is mounted there: not the run's
            os.close(child)
            continue
        return child, f"{prefix}{name}/"
    return -1, ""


def _short(path: str, most: int = 60) -> str:
    return path if len(path) <= most else f"{path[: most - 3]}..."


def _device(fd: int) -> int:
    try:
        return os.fstat(fd).st_dev
    except OSError:
        return -1


def open_beneath(root: Path | str, rel: str) -> int:
    """A descriptor of the regular file at ``rel`` under ``root``, opened for reading without
    ever leaving ``root``: each directory is opened relative to the one before with
    ``O_NOFOLLOW``; a symlink met on the way is read and resolved here, relative to where it
    is, and one that is absolute or climbs above ``root`` is refused, as is anything that is not
    a regular file on ``root``'s file system when it is opened. Raises Refused."""
    try:
        dirs = [os.open(root, _DIR)]
    except OSError as e:
        raise Refused(f"cannot open the output directory: {e.strerror}") from e
    parts = _parts(rel)
    links = 0
    try:
        device = os.fstat(dirs[0]).st_dev
        while parts:
            part = parts.pop()
            if part == "..":
                if len(dirs) == 1:
                    raise Refused(_OUTSIDE)
                os.close(dirs.pop())
                continue
            last = not parts
            try:
                fd = os.open(part, _FILE if last else _DIR, dir_fd=dirs[-1])
            except OSError as e:
                # O_NOFOLLOW met a symlink (ELOOP; ENOTDIR where a directory was asked for):
                # resolve it here
                if e.errno not in (errno.ELOOP, errno.ENOTDIR):
                    raise Refused(e.strerror) from e
                links += 1
                parts.extend(_symlink(dirs[-1], part, links))
                continue
            info = os.fstat(fd)
            if info.st_dev != device or (last and not stat.S_ISREG(info.st_mode)):
                os.close(fd)
                linked_dir = last and links and stat.S_ISDIR(info.st_mode)
                raise Refused("symlinked directory" if linked_dir else "not a regular file")
            if last:
                return fd
            dirs.append(fd)
        raise Refused("not a regular file")
    finally:
        for fd in dirs:
            os.close(fd)


def _parts(path: str) -> list[str]:
    """``path``'s components, reversed (the next one last), without empty and ``.`` ones."""
    return [p for p in reversed(path.split("/")) if p not in ("", ".")]


def _symlink(dir_fd: int, name: str, links: int) -> list[str]:
    if links > MAX_LINKS:
        raise Refused("too many levels of symlinks")
    try:
        target = os.readlink(name, dir_fd=dir_fd)
    except OSError as e:  # EINVAL: no symlink, so no directory where one was needed
        raise Refused("not a regular file" if e.errno == errno.EINVAL else e.strerror) from e
    if target.startswith("/"):
        raise Refused(_OUTSIDE)
    return _parts(target)


def remove_tree(path: Path | str) -> str | None:
    """Remove ``path`` and everything under it (or the file or symlink it is), never following a
    symlink or leaving its file system, however deep: a directory deeper than ``MOVE_DEPTH`` is
    first moved up beside ``path`` (one rename) and removed from there, so the descriptors held
    stay few. Goes on past what it cannot remove; returns what that was, or None when it is all
    gone. Never raises for what is in the tree."""
    path = Path(path)
    try:
        parent = os.open(path.parent, _DIR)
    except FileNotFoundError:
        return None
    except OSError as e:
        return f"{path.parent}: {e.strerror}"
    problems: list[str] = []
    try:
        device = os.fstat(parent).st_dev
        todo = [path.name]
        while todo:
            _remove(parent, todo.pop(), device, todo, problems)
    finally:
        os.close(parent)
    if not problems:
        return None
    return "; ".join(problems[:3]) + (f" (and {len(problems) - 3} more)" if len(problems) > 3 else "")


def _remove(top: int, name: str, device: int, todo: list[str], problems: list[str]) -> None:
    """Remove ``name`` in directory ``top``, depth first, holding at most MOVE_DEPTH descriptors."""
    fd = _open_or_unlink(top, name, device, problems)
    frames: list[tuple[int, str, list[str]]] = []
    try:
        while fd >= 0:
            subdirs: list[str] = []
            frames.append((fd, name, subdirs))
            _unlink_files(fd, subdirs, problems)
            fd = -1
            while frames and fd < 0:
                current, _, pending = frames[-1]
                if not pending:
                    os.close(current)
                    _, done, _ = frames.pop()
                    _rmdir(frames[-1][0] if frames else top, done, problems)
                    continue
                name = pending.pop()
                if len(frames) >= MOVE_DEPTH:  # finish it later from the top: few descriptors held
                    moved = f".rp-removing-{uuid.uuid4().hex[:16]}"
                    try:
                        os.rename(name, moved, src_dir_fd=current, dst_dir_fd=top)
                        todo.append(moved)
                    except OSError as e:
                        _problem(problems, name, e)
                    continue
                fd = _open_or_unlink(current, name, device, problems)
    finally:
        for held, _, _ in frames:
            os.close(held)


def _open_or_unlink(parent: int, name: str, device: int, problems: list[str]) -> int:
    """``name``'s descriptor if it is a directory of this file system; a file or symlink is
    unlinked instead. -1 when there is nothing to descend into."""
    try:
        fd = os.open(name, _DIR, dir_fd=parent)
    except OSError as e:
        if e.errno in (errno.ENOTDIR, errno.ELOOP):
            try:
                os.unlink(name, dir_fd=parent)
            except FileNotFoundError:
                pass
            except OSError as unlink_error:
                _problem(problems, name, unlink_error)
        elif e.errno != errno.ENOENT:
            _problem(problems, name, e)
        return -1
    if _device(fd) != device:
        os.close(fd)
        problems.append(f"{name}: another file system is mounted there")
        return -1
    return fd


def _unlink_files(fd: int, subdirs: list[str], problems: list[str]) -> None:
    try:
        with os.scandir(fd) as listing:
            for entry in listing:
                if _is_dir(entry):
                    subdirs.append(entry.name)
                    continue
                try:
                    os.unlink(entry.name, dir_fd=fd)
                except FileNotFoundError:
                    pass
                except IsADirectoryError:  # replaced by a directory meanwhile
                    subdirs.append(entry.name)
                except OSError as e:
                    _problem(problems, entry.name, e)
    except OSError as e:
        problems.append(f"cannot list a directory: {e.strerror}")


def _rmdir(parent: int, name: str, problems: list[str]) -> None:
    try:
        os.rmdir(name, dir_fd=parent)
    except FileNotFoundError:
        pass
    except OSError as e:
        _problem(problems, name, e)


def _problem(problems: list[str], name: str, e: OSError) -> None:
    problems.append(f"{name}: {e.strerror}")
