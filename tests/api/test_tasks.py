"""`/v1/environments/{name}/tasks` (JSONL upload, raw or multipart) and `/v1/tasks`.

Uploads are data: a repository travels in the upload as a checked archive, and no path a request
names is read on the server (the attacks of issue 11 — `/etc`, `../`, a root-only file — are here).
"""

from __future__ import annotations

import base64
import io
import json
import os
import subprocess
import tarfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from core.settings import get_settings
from environments.code_repo.snapshot import BUNDLE_REF, pack_directory, pack_git

SECRET = "root-only secret 7c1f"


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    directory = tmp_path / "calc"
    directory.mkdir()
    (directory / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    return directory


@pytest.fixture
def secret_dir(tmp_path: Path) -> Path:
    """A directory on the API host holding a mode-600 file, as the issue's probe found one."""
    directory = tmp_path / "private"
    directory.mkdir()
    secret = directory / "shadow"
    secret.write_text(SECRET)
    secret.chmod(0o600)
    with tarfile.open(directory / "loot.tar.gz", "w:gz") as tar:
        tar.add(secret, arcname="shadow")
    return directory


@pytest.fixture
def settings_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    """Change CRUCIBLE_* settings for one test (the settings object is cached per process)."""
    yield monkeypatch
    monkeypatch.undo()
    get_settings.cache_clear()


def _set(settings_env: pytest.MonkeyPatch, **values: object) -> None:
    for key, value in values.items():
        settings_env.setenv(f"CRUCIBLE_{key.upper()}", str(value))
    get_settings.cache_clear()


def _line(repo: Path | dict | str, task_id: str, split: str = "train") -> str:
    archive = pack_directory(repo).model_dump() if isinstance(repo, Path) else repo
    return json.dumps({"id": task_id, "instruction": f"fix {task_id}", "split": split, "repo": archive,
                       "hidden_tests": {"paths": ["test_calc.py"]}})


def _tarball(add: Callable[[tarfile.TarFile], None]) -> dict:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        add(tar)
    return {"format": "tar", "data_b64": base64.b64encode(buffer.getvalue()).decode()}


def _member(name: str, *, kind: bytes = tarfile.REGTYPE, link: str = "", data: bytes = b"x"
            ) -> Callable[[tarfile.TarFile], None]:
    def add(tar: tarfile.TarFile) -> None:
        info = tarfile.TarInfo(name)
        info.type, info.linkname = kind, link
        info.size = len(data) if kind == tarfile.REGTYPE else 0
        tar.addfile(info, io.BytesIO(data) if kind == tarfile.REGTYPE else None)
    return add


@pytest.fixture
def calc(client: TestClient) -> str:
    assert client.post("/v1/environments", json={"name": "calc", "kind": "code_repo"}).status_code == 201
    return "calc"


def _upload(client: TestClient, env: str, body: str, **params: str):  # type: ignore[no-untyped-def]
    return client.post(f"/v1/environments/{env}/tasks", content=body, params=params,
                       headers={"content-type": "application/x-ndjson"})


def test_upload_a_raw_jsonl_body_then_update_by_multipart(client: TestClient, calc: str, repo: Path) -> None:
    body = "\n".join([_line(repo, "t1"), _line(repo, "t2", "test")]) + "\n"
    response = _upload(client, calc, body)
    assert response.status_code == 201 and response.json() == {"environment": "calc", "imported": 2}
    files = {"file": ("tasks.jsonl", _line(repo, "t1", "test").encode(), "application/x-ndjson")}
    assert client.post(f"/v1/environments/{calc}/tasks", files=files).json()["imported"] == 1

    tasks = client.get("/v1/tasks?environment=calc&split=test").json()["data"]
    assert sorted(task["external_id"] for task in tasks) == ["t1", "t2"]
    assert "payload" not in tasks[0]  # summaries in lists


def test_show_elides_the_repo_tarball_unless_asked(client: TestClient, calc: str, repo: Path) -> None:
    _upload(client, calc, "\n".join(_line(repo, f"t{i}") for i in range(3)))
    task_id = client.get("/v1/tasks?environment=calc&limit=1").json()["data"][0]["id"]
    shown = client.get(f"/v1/tasks/{task_id}").json()
    assert shown["instruction"] == "fix t0" and shown["payload"]["hidden_tests"]["paths"] == ["test_calc.py"]
    full = client.get(f"/v1/tasks/{task_id}?elide_over=0").json()
    with tarfile.open(fileobj=io.BytesIO(base64.b64decode(full["payload"]["repo"]["data_b64"]))) as tar:
        assert tar.getnames() == ["calc.py"]


def test_an_upload_larger_than_memory_spooling_is_read_from_disk(client: TestClient, calc: str, repo: Path) -> None:
    (repo / "blob.bin").write_bytes(os.urandom(1_500_000))  # incompressible: the upload passes 1 MiB
    body = "\n".join(_line(repo, f"t{i}") for i in range(2))
    assert len(body) > 2**21
    response = _upload(client, calc, body)
    assert response.status_code == 201, response.text[:300]
    assert response.json()["imported"] == 2


def test_tasks_are_paged_by_id(client: TestClient, calc: str, repo: Path) -> None:
    _upload(client, calc, "\n".join(_line(repo, f"t{i}") for i in range(5)))
    seen, cursor = [], None
    while True:
        page = client.get("/v1/tasks", params={"limit": 2, **({"cursor": cursor} if cursor else {})}).json()
        seen += [task["external_id"] for task in page["data"]]
        if not (cursor := page["next_cursor"]):
            break
    assert seen == [f"t{i}" for i in range(5)]


@pytest.mark.parametrize("path", ["/etc", "../../../../etc", "/proc/self/root/etc", "repos/calc"])
def test_a_server_path_as_repo_is_refused(client: TestClient, calc: str, path: str) -> None:
    response = _upload(client, calc, _line(path, "steal"))
    assert response.status_code == 422
    message = response.json()["error"]["message"]
    assert "line:1: repo: expected an uploaded archive" in message and "the API reads no server paths" in message
    assert client.get("/v1/tasks").json()["data"] == []


def test_a_root_only_file_cannot_be_read_back(client: TestClient, calc: str, secret_dir: Path,
                                              settings_env: pytest.MonkeyPatch) -> None:
    """Every way the old API read a server path: a directory, a `.tar.gz`, a SWE-bench repos_dir."""
    for repo in (str(secret_dir), str(secret_dir / "loot.tar.gz")):
        assert _upload(client, calc, _line(repo, "loot")).status_code == 422
    swebench = json.dumps({"instance_id": "x", "repo": "private", "base_commit": "HEAD", "problem_statement": "p",
                           "test_patch": "", "FAIL_TO_PASS": "[]"})
    refused = _upload(client, calc, swebench, format="swebench", repos_dir=str(secret_dir.parent))
    assert refused.status_code == 422 and "CRUCIBLE_TASK_REPOS_ROOT is unset" in refused.json()["error"]["message"]
    for task in client.get("/v1/tasks").json()["data"]:
        assert SECRET not in json.dumps(client.get(f"/v1/tasks/{task['id']}?elide_over=0").json())
    assert client.get("/v1/tasks").json()["data"] == []


@pytest.mark.parametrize(("archive", "message"), [
    (_tarball(_member("/etc/cron.d/x")), "expected paths inside the repository, got '/etc/cron.d/x'"),
    (_tarball(_member("../../outside")), "expected paths inside the repository, got '../../outside'"),
    (_tarball(_member("a/../../outside")), "expected paths inside the repository"),
    (_tarball(_member("link", kind=tarfile.SYMTYPE, link="/etc/passwd")), "expected links that stay inside"),
    (_tarball(_member("sub/link", kind=tarfile.SYMTYPE, link="../../x")), "expected links that stay inside"),
    (_tarball(_member("hard", kind=tarfile.LNKTYPE, link="../x")), "expected hard links inside the repository"),
    (_tarball(_member("null", kind=tarfile.CHRTYPE)), "got a character device at 'null'"),
    (_tarball(_member("fifo", kind=tarfile.FIFOTYPE)), "got a fifo at 'fifo'"),
    ({"format": "tar", "data_b64": base64.b64encode(b"plain text, not gzip").decode()}, "data that is not gzip"),
    ({"format": "tar", "data_b64": base64.b64encode(b"\x1f\x8b garbage").decode()}, "expected a readable gzip tar"),
    ({"format": "tar", "data_b64": "not base64!"}, "data_b64: expected base64"),
    ({"format": "git_bundle", "data_b64": base64.b64encode(b"# v2 git bundle\nrubbish\n\nPACK").decode()},
     "expected a readable git bundle"),
    ({"format": "git_bundle", "data_b64": base64.b64encode(b"PK\x03\x04 a zip").decode()}, "expected a git bundle"),
    ({"format": "zip", "data_b64": ""}, "repo.format: Input should be 'tar' or 'git_bundle'"),
])
def test_an_unsafe_archive_is_refused_before_it_is_stored(client: TestClient, calc: str, archive: dict,
                                                          message: str) -> None:
    response = _upload(client, calc, _line(archive, "evil"))
    assert response.status_code == 422, response.text
    assert message in response.json()["error"]["message"]
    assert client.get("/v1/tasks").json()["data"] == []


def _git_repo(path: Path) -> str:
    path.mkdir()
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "base"]):
        if args[0] == "add":
            (path / "calc.py").write_text("def add(a, b):\n    return a - b\n")
        subprocess.run(["git", "-C", str(path), *args], check=True, env=env)
    return subprocess.run(["git", "-C", str(path), "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()


def _tree_state(git_dir: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(git_dir)): (p.stat().st_mtime_ns, p.stat().st_size) for p in git_dir.rglob("*")}


def test_pack_git_bundles_without_writing_to_the_source_repository(client: TestClient, calc: str,
                                                                   tmp_path: Path) -> None:
    sha = _git_repo(tmp_path / "src")
    before = _tree_state(tmp_path / "src" / ".git")
    snapshot = pack_git(tmp_path / "src", commit=sha)
    assert _tree_state(tmp_path / "src" / ".git") == before  # no ref, no reflog, no index write
    refs = subprocess.run(["git", "-C", str(tmp_path / "src"), "for-each-ref"], capture_output=True, text=True).stdout
    assert BUNDLE_REF not in refs
    response = _upload(client, calc, _line(snapshot.model_dump(), "bundled"))  # a real bundle is accepted
    assert response.status_code == 201, response.text


def test_swebench_repos_are_read_only_inside_the_operators_root(client: TestClient, calc: str, tmp_path: Path,
                                                                 settings_env: pytest.MonkeyPatch) -> None:
    root = tmp_path / "clones"
    root.mkdir()
    sha = _git_repo(root / "octo__calc")
    outside_sha = _git_repo(tmp_path / "outside")
    _set(settings_env, task_repos_root=root)

    def line(repo: str, commit: str) -> str:
        return json.dumps({"instance_id": "i1", "repo": repo, "base_commit": commit, "problem_statement": "fix add",
                           "test_patch": "", "FAIL_TO_PASS": '["test_calc.py::test_add"]', "PASS_TO_PASS": "[]"})

    ok = _upload(client, calc, line("octo/calc", sha), format="swebench", repos_dir=str(root))
    assert ok.status_code == 201, ok.text
    for repos_dir in ("..", str(tmp_path), f"{root}/../outside", "/etc"):
        response = _upload(client, calc, line("octo/calc", sha), format="swebench", repos_dir=repos_dir)
        assert response.status_code == 422, repos_dir
        assert f"repos_dir: expected a directory inside {root}" in response.json()["error"]["message"]
    escaped = _upload(client, calc, line("../outside", outside_sha), format="swebench", repos_dir=str(root))
    assert escaped.status_code == 422 and "expected an owner/name" in escaped.json()["error"]["message"]
    (root / "sneaky").symlink_to(tmp_path / "outside")
    linked = _upload(client, calc, line("sneaky", outside_sha), format="swebench", repos_dir=".")
    assert linked.status_code == 422 and f"expected a clone inside {root}" in linked.json()["error"]["message"]


def test_an_upload_over_the_limit_is_413_while_it_streams(client: TestClient, calc: str, repo: Path,
                                                         settings_env: pytest.MonkeyPatch) -> None:
    _set(settings_env, api_max_upload_bytes=64 * 1024)
    line = (_line(repo, "t") + "\n").encode()

    def chunks() -> Iterator[bytes]:  # no Content-Length: only counting the stream can stop it
        for _ in range(200):
            yield line

    response = client.post(f"/v1/environments/{calc}/tasks", content=chunks(), headers={"content-type": "text/plain"})
    assert response.status_code == 413, response.text
    assert response.json()["error"] == {"code": "too_large", "message": "body: expected at most 65536 bytes, got more",
                                        "detail": None}
    declared = client.post(f"/v1/environments/{calc}/tasks", content=line * 200, headers={"content-type": "text/plain"})
    assert declared.status_code == 413 and "got a Content-Length of '" in declared.json()["error"]["message"]
    multipart = client.post(f"/v1/environments/{calc}/tasks", files={"file": ("t.jsonl", line * 200)})
    assert multipart.status_code == 413
    assert client.get("/v1/tasks").json()["data"] == []


@pytest.mark.parametrize(("body", "message"), [
    ("", "body: expected JSONL (one task object per line), got an empty upload"),
    ("not json", "expected one JSON object per line"),
    ("[1, 2]", "line:1: expected a JSON object, got list"),
    ('{"id": "x", "repo": {"format": "tar", "data_b64": "\\ud800"}}', "lone UTF-16 surrogate"),
    ('{"id": "x", "instruction": "' + "[" * 1 + '", "repo": ' + "[" * 500 + "]" * 500 + "}",
     "expected nesting at most 16 deep"),
    ("\xff\xfe{}", "expected UTF-8 JSONL"),
])
def test_bad_uploads_are_422_with_the_line_and_the_problem(client: TestClient, calc: str, body: str, message: str) -> None:
    raw = body.encode("latin-1") if body.startswith("\xff") else body.encode("utf-8", "surrogatepass")
    response = client.post(f"/v1/environments/{calc}/tasks", content=raw)
    assert response.status_code == 422, response.text
    assert message in response.json()["error"]["message"]


def test_field_sizes_are_checked_at_upload(client: TestClient, calc: str, repo: Path) -> None:
    """A 100 KB id used to reach the unique index and come back as 503 "the database does not answer"."""
    line = json.loads(_line(repo, "x"))
    response = _upload(client, calc, json.dumps({**line, "id": "x" * 100_000}))
    assert response.status_code == 422 and "id: expected at most 256 characters, got 100000" in response.text
    response = _upload(client, calc, json.dumps({**line, "hidden_tests": {"paths": ["/etc/passwd"]}}))
    assert response.status_code == 422 and "hidden_tests.paths" in response.json()["error"]["message"]


def test_an_upload_to_an_unknown_environment_is_404(client: TestClient) -> None:
    response = client.post("/v1/environments/ghost/tasks", content="{}")
    assert response.status_code == 404 and "no environment named 'ghost'" in response.json()["error"]["message"]


def test_a_multipart_upload_without_a_file_field(client: TestClient, calc: str) -> None:
    response = client.post(f"/v1/environments/{calc}/tasks", files={"other": ("x", b"{}")})
    assert response.status_code == 422 and "multipart field 'file'" in response.json()["error"]["message"]
