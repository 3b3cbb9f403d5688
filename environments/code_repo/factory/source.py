"""Where a factory's package comes from: a PyPI source distribution, a local directory or archive, or a
git repository; unpacked into a directory with no history, no build litter and no documentation tree.

    tree = fetch("pypi:toolz==1.0.0", into=workdir)     # the sdist, from pip's configured indexes
    tree = fetch("./mylib", into=workdir)               # a directory (its .git is never copied)
    tree = fetch("dist/mylib-1.0.tar.gz", into=workdir) # an sdist on disk
    tree = fetch("git:../mylib@v1.0", into=workdir)     # a clone of one revision, then its .git removed

Archives are unpacked with the checks a task snapshot gets (snapshot.check_member: no absolute paths,
no `..`, no links out, no devices): a hostile sdist is refused, not unpacked.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import sys
import tarfile
import time
import urllib.parse
import zipfile
from html.parser import HTMLParser
from pathlib import Path

from core.errors import ConfigError
from environments.code_repo.snapshot import check_member, git_env

PYPI = re.compile(r"^pypi:(?P<name>[A-Za-z0-9][A-Za-z0-9._-]{0,99})==(?P<version>[A-Za-z0-9][A-Za-z0-9.+!_-]{0,63})$")
LITTER = {".git", ".hg", ".svn", "__pycache__", ".tox", ".nox", ".eggs", "build", "dist", ".pytest_cache",
          ".mypy_cache", "docs", "doc", "benchmarks", "bench", ".github", "site"}
"""Directories never copied into a task's repository (history, caches, build output, documentation)."""
MAX_FILE_BYTES = 2 * 2**20
MAX_TREE_BYTES = 64 * 2**20
MAX_MEMBERS = 50_000
FETCH_DEADLINE_S = 300.0
MAX_ARCHIVE_BYTES = 64 * 2**20


def name_of(source: str) -> str:
    """A short name for reports and task ids: `toolz-1.0.0`, `mylib`."""
    match = PYPI.match(source)
    if match:
        return f"{match['name']}-{match['version']}"
    revision = ""
    if source.startswith("git:"):
        source, revision = _split_revision(source.removeprefix("git:"))
    stem = source.rstrip("/").rsplit("/", 1)[-1].rsplit(":", 1)[-1]
    for suffix in (".tar.gz", ".tgz", ".zip", ".git"):
        stem = stem.removesuffix(suffix)
    name = f"{stem}-{revision}" if revision else stem
    return re.sub(r"[^A-Za-z0-9._-]", "-", name)[:80] or "package"


def fetch(source: str, *, into: Path) -> Path:
    """The package's tree under `into` (a directory the caller owns). ConfigError names what went wrong."""
    into.mkdir(parents=True, exist_ok=True)
    tree = into / "tree"
    if source.startswith("pypi:"):
        match = PYPI.match(source)
        if match is None:
            raise ConfigError(f"source: expected pypi:NAME==VERSION, got {source[:200]!r}")
        _unpack(_download(match["name"], match["version"], into=into / "download"), tree)
    elif source.startswith("git:"):
        _clone(source.removeprefix("git:"), tree)
    else:
        path = Path(source).expanduser()
        if path.is_dir():
            _copy(path, tree)
        elif path.is_file() and path.name.endswith((".tar.gz", ".tgz", ".zip")):
            _unpack(path, tree)
        else:
            raise ConfigError(f"source: expected pypi:NAME==VERSION, git:REPO[@REV], a directory or an sdist "
                              f"(.tar.gz, .zip), got {source[:200]!r}")
    return _project_root(tree)


def _download(name: str, version: str, *, into: Path) -> Path:
    """The source distribution `name`==`version`, from the package indexes pip is configured with
    (find-links directories, then index-url and extra-index-url), its sha256 checked when the index gives
    one. Never `pip download`: that prepares an sdist's metadata, which runs its build backend (its
    setup.py) on this machine; here nothing of the package runs outside a sandbox."""
    from packaging.utils import InvalidSdistFilename, canonicalize_name, parse_sdist_filename
    from packaging.version import InvalidVersion, Version

    try:
        wanted = (canonicalize_name(name), Version(version))
    except InvalidVersion:
        raise ConfigError(f"pypi:{name}=={version}: expected a version such as 1.0.2, got {version[:64]!r}") from None

    def matches(filename: str) -> bool:
        try:
            return parse_sdist_filename(filename) == wanted
        except (InvalidSdistFilename, InvalidVersion):
            return False

    indexes, find_links = _pip_sources()
    for directory in find_links:
        folder = Path(directory.removeprefix("file://"))
        for candidate in sorted(folder.glob("*")) if folder.is_dir() else []:
            if matches(candidate.name):
                target = into / candidate.name
                into.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(candidate, target)
                return target
    tried = []
    for index in indexes:
        page = _get(f"{index.rstrip('/')}/{canonicalize_name(name)}/")
        tried.append(index)
        if page is None:
            continue
        for href, filename in _anchors(page.decode(errors="replace")):
            if not matches(filename):
                continue
            url = urllib.parse.urljoin(f"{index.rstrip('/')}/{canonicalize_name(name)}/", href)
            location, _, fragment = url.partition("#")
            data = _get(location, limit=MAX_ARCHIVE_BYTES)
            if data is None:
                raise ConfigError(f"pypi:{name}=={version}: the index lists {filename} but it could not be fetched")
            expected = dict(part.split("=", 1) for part in fragment.split("&") if "=" in part).get("sha256")
            if expected and hashlib.sha256(data).hexdigest() != expected.lower():
                raise ConfigError(f"pypi:{name}=={version}: {filename} does not match the sha256 its index gives")
            into.mkdir(parents=True, exist_ok=True)
            target = into / Path(urllib.parse.unquote(urllib.parse.urlparse(location).path)).name
            if not matches(target.name):
                raise ConfigError(f"pypi:{name}=={version}: expected a link to a {name}-{version} sdist, got {target.name[:200]!r}")
            target.write_bytes(data)
            return target
    looked = ", ".join(_without_credentials(place) for place in [*find_links, *tried])
    raise ConfigError(f"pypi:{name}=={version}: expected a source distribution (.tar.gz or .zip) on the configured "
                      f"indexes, found none (looked in {looked[:300]})")


def _without_credentials(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    return urllib.parse.urlunsplit(parts._replace(netloc=parts.hostname or ""))


class _Anchors(HTMLParser):
    """(href, text) of every <a> of a PEP 503 page: a parser, linear in the page (a regular expression
    over a hostile page can take cubic time)."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.found: list[tuple[str, str]] = []
        self._href: str | None = None
        self._text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            self._href, self._text = dict(attrs).get("href"), []

    def handle_data(self, data: str) -> None:
        if self._href is not None and sum(map(len, self._text)) < 1000:
            self._text.append(data)

    def handle_endtag(self, tag: str) -> None:
        if tag == "a" and self._href is not None:
            self.found.append((self._href, "".join(self._text).strip()))
            self._href = None


def _anchors(page: str) -> list[tuple[str, str]]:
    parser = _Anchors()
    parser.feed(page)
    parser.close()
    return parser.found


def _pip_sources() -> tuple[list[str], list[str]]:
    """(index URLs, find-links locations) as pip is configured here (`pip config list`: files and PIP_*)."""
    # -I: nothing in the working directory (a `pip/` folder) is imported in place of pip.
    listed = subprocess.run([sys.executable, "-I", "-m", "pip", "config", "list"], capture_output=True, text=True,
                            timeout=60)
    values: dict[str, list[str]] = {}
    for line in listed.stdout.splitlines():
        key, _, value = line.partition("=")
        option = key.rsplit(".", 1)[-1]
        # A multi-line setting is listed with its newlines escaped ('\nhttps://a\nhttps://b').
        values.setdefault(option, []).extend(value.strip().strip("'\"").replace("\\n", " ").split())
    indexes = (values.get("index-url") or ["https://pypi.org/simple"])[-1:] + values.get("extra-index-url", [])
    return list(dict.fromkeys(indexes)), list(dict.fromkeys(values.get("find-links", [])))


def _get(url: str, *, limit: int = 16 * 2**20) -> bytes | None:
    """A page or file of an index (file:// or http(s)://), at most `limit` bytes; None if it is not there."""
    if url.startswith("file://"):
        path = Path(urllib.parse.unquote(urllib.parse.urlparse(url).path))
        if path.is_dir():
            path = path / "index.html"
        return path.read_bytes()[:limit + 1] if path.is_file() and path.stat().st_size <= limit else None
    if not url.startswith(("https://", "http://")):
        return None
    import httpx

    deadline = time.monotonic() + FETCH_DEADLINE_S  # a server that trickles a byte a minute is cut off here
    try:
        with httpx.stream("GET", url, timeout=60, follow_redirects=True) as response:
            if response.status_code != 200:
                return None
            data = bytearray()
            for chunk in response.iter_bytes():
                data += chunk
                if len(data) > limit or time.monotonic() > deadline:
                    return None
            return bytes(data)
    except httpx.HTTPError:
        return None


def _unpack(archive: Path, tree: Path) -> None:
    if archive.stat().st_size > MAX_ARCHIVE_BYTES:
        raise ConfigError(f"{archive.name}: expected an archive of at most {MAX_ARCHIVE_BYTES} bytes, "
                          f"got {archive.stat().st_size}")
    tree.mkdir(parents=True)
    where = f"source {archive.name}"
    budget = _Budget(where)

    def write(name: str, data: bytes, *, executable: bool = False) -> None:
        target = tree / name
        if target.is_dir() or any(parent.is_file() for parent in target.parents if parent != tree):
            raise ConfigError(f"{where}: expected each path once, as a file or a folder, got {name[:200]!r} as both")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        target.chmod(0o755 if executable else 0o644)

    try:
        if archive.name.endswith(".zip"):
            with zipfile.ZipFile(archive) as zipped:
                for info in zipped.infolist():
                    member = tarfile.TarInfo(info.filename.rstrip("/"))
                    member.type = tarfile.DIRTYPE if info.is_dir() else tarfile.REGTYPE
                    check_member(member, where=where)
                    budget.count(0 if info.is_dir() else info.file_size)
                    if not info.is_dir() and info.file_size <= MAX_FILE_BYTES:
                        write(member.name, zipped.read(info)[:MAX_FILE_BYTES + 1])
            return
        with tarfile.open(archive, mode="r:*") as tar:
            for member in tar:  # streamed, and each member forgotten once read: a bomb stops at the bound
                tar.members.clear()  # type: ignore[attr-defined]
                check_member(member, where=where)
                budget.count(member.size if member.isfile() else 0)
                if member.isfile() and member.size <= MAX_FILE_BYTES:
                    handle = tar.extractfile(member)
                    write(member.name, handle.read() if handle else b"", executable=bool(member.mode & 0o111))
    except (tarfile.TarError, zipfile.BadZipFile, EOFError, OSError, ValueError) as error:
        raise ConfigError(f"{where}: expected a readable archive, got a broken one ({str(error)[:200]})") from None


class _Budget:
    """What a source may unpack to: at most MAX_MEMBERS entries and MAX_TREE_BYTES of files."""

    def __init__(self, where: str) -> None:
        self.where, self.members, self.bytes = where, 0, 0

    def count(self, size: int) -> None:
        self.members += 1
        self.bytes += max(size, 0) if size <= MAX_FILE_BYTES else 0
        if self.members > MAX_MEMBERS or self.bytes > MAX_TREE_BYTES:
            raise ConfigError(f"{self.where}: expected at most {MAX_MEMBERS} entries and {MAX_TREE_BYTES} bytes of "
                              f"files, got more")


def _copy(path: Path, tree: Path) -> None:
    budget = _Budget(f"source {path}")

    def ignore(directory: str, names: list[str]) -> list[str]:
        skipped = [n for n in names if n in LITTER or _is_litter_file(n)]
        for name in names:
            if name not in skipped:
                child = Path(directory) / name
                budget.count(child.lstat().st_size if child.is_file() and not child.is_symlink() else 0)
        return skipped

    shutil.copytree(path, tree, symlinks=True, ignore=ignore)


def _split_revision(spec: str) -> tuple[str, str]:
    """`REPOSITORY[@REVISION]`: the revision is after the last `@`, when that part is not a host or a path
    (`git@host:repo.git` and `ssh://git@host/repo` name no revision)."""
    repository, at, revision = spec.rpartition("@")
    if not at or not repository or "/" in revision or ":" in revision:
        return spec, ""
    return repository, revision


def _clone(spec: str, tree: Path) -> None:
    repository, revision = _split_revision(spec)
    if not repository or repository.startswith("-") or (revision and revision.startswith("-")):
        raise ConfigError(f"source: expected git:REPOSITORY[@REVISION], got {('git:' + spec)[:200]!r}")
    git = ["git", "-c", "core.fsmonitor=false", "-c", "protocol.file.allow=always"]
    cloned = subprocess.run([*git, "clone", "--quiet", "--no-checkout", "--", repository, str(tree)],
                            capture_output=True, text=True, timeout=600, env=git_env())
    if cloned.returncode == 0:
        cloned = subprocess.run([*git, "-C", str(tree), "checkout", "--quiet", revision or "HEAD", "--"],
                                capture_output=True, text=True, timeout=600, env=git_env())
    if cloned.returncode != 0:
        raise ConfigError(f"git:{spec[:200]}: expected a repository and revision git can check out, got "
                          f"{(cloned.stderr.strip().splitlines() or ['an error'])[-1][:200]}")
    shutil.rmtree(tree / ".git")  # the base commit is the task's only commit: no history to mine


def _is_litter_file(name: str) -> bool:
    """Byte code, editor and patch leftovers: any of them can hold the original of the code a task breaks."""
    return name.endswith((".pyc", ".pyo", "~", ".orig", ".rej", ".swp", ".bak"))


def _project_root(tree: Path) -> Path:
    """The directory holding the project: an sdist's single top-level folder, else the tree itself. Litter
    (LITTER) and files over MAX_FILE_BYTES are removed; links are kept only when they stay inside."""
    children = [child for child in tree.iterdir()]
    root = children[0] if len(children) == 1 and children[0].is_dir() else tree
    budget = _Budget(f"source {root.name}")
    for path in sorted(root.rglob("*"), key=lambda p: len(p.parts), reverse=True):
        relative = path.relative_to(root)
        budget.count(0)  # entries only: a git checkout's sizes are bounded by git, not counted twice
        if set(relative.parts) & LITTER or any(part.endswith(".egg-info") for part in relative.parts) \
                or (path.is_file() and _is_litter_file(path.name)):
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
        elif path.is_symlink():
            target = (path.parent / path.readlink()).resolve()
            if not target.is_relative_to(root.resolve()):
                path.unlink()
        elif path.is_file() and path.stat().st_size > MAX_FILE_BYTES:
            path.unlink()
    return root

