"""The code_repo verifier: rules → public tests → hidden tests, every layer logged on its own.

    verdict = verify(sandbox=agent_sb, task=task, base=base_sha, submitted=True, open_sandbox=fresh,
                     actions=calls, config=spec.verifier)

1. The agent's files are read out of its sandbox by the keeper uid (its processes stopped first);
   its .git is only inspected (history rewritten? base tag moved? deleted?), never trusted.
2. In a FRESH sandbox: the base commit (the id the worker recorded) + those files → the diff, by our
   own git. That diff is the submission: stored as `final_diff`, and exactly what every layer grades.
3. `rules`: a submission, a non-empty change, and no hack-monitor flag (monitors.py: protected paths,
   runner configuration, runner shadowing, forged exits, result forging, skips, git history, the
   agent's shell commands).
4. `public_tests` in that fresh sandbox (nothing of the agent's has run there), `hidden_tests` in a
   second fresh one, both through the trusted runner (grader.py), scored per test id. A layer that
   names no tests grades the ids it collects on the base, collected once per task (memo.py).

Flags cost what `verifier.flag_policy` says: `zero` (default; the test layers do not run), `penalize`
(reward − flag_penalty), `record` (environments.rewards.total). What the agent caused — an unreadable
workspace, a tree that cannot be unpacked, a test patch its change conflicts with — is a Verdict whose
layers score 0, with the reason;
only faults of the machine raise GraderFault (retried).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from core.errors import CrucibleError
from core.flags import EpisodeFlag
from environments.base import GraderFault, LayerResult, OpenSandbox, Sandbox, ToolCall, Verdict
from environments.code_repo import monitors
from environments.code_repo.blinding import Key, unblinded_key
from environments.code_repo.grader import collect_test_ids, put_or_reject, run_tests
from environments.code_repo.harbor_tests import run_harbor_tests
from environments.code_repo.memo import TaskMemo
from environments.code_repo.reference import reference_key, unblinded_reason
from environments.code_repo.repo import (
    WORKSPACE,
    Blob,
    SetupError,
    SubmissionError,
    apply_patch,
    changed_files,
    check_git,
    forget_history,
    install_repo,
    installed_modules,
    load_submission,
    read_workspace,
    staged_blobs,
    staged_diff,
)
from environments.code_repo.task import DEFAULT_PROTECTED, CodeRepoTask, HarborTests, TestSpec
from environments.rewards import FlagPolicy
from environments.spec import VerifierConfig

DEFAULT_WEIGHTS = {"rules": 0.0, "public_tests": 0.0, "hidden_tests": 1.0}
CONFIG_FILES = {"tox.ini", "setup.cfg", "pyproject.toml"}
MAX_DIFF_BYTES = 16 << 20
MAX_INSPECTED_BYTES = 4 << 20
SYMLINK_MODE = "120000"
_collected: TaskMemo[list[str] | None] = TaskMemo()
_installed: TaskMemo[frozenset[str]] = TaskMemo(size=64)


def verify(
    *, sandbox: Sandbox, task: CodeRepoTask, base: str, submitted: bool, open_sandbox: OpenSandbox,
    actions: Sequence[ToolCall], config: VerifierConfig,
) -> Verdict:
    try:
        return _verify(sandbox=sandbox, task=task, base=base, submitted=submitted, open_sandbox=open_sandbox,
                       actions=actions, config=config)
    except SubmissionError as error:
        return _rejected(task, str(error))
    except (SetupError, CrucibleError) as error:  # the engine, a sandbox that would not start, our own git
        raise GraderFault(f"grading failed: {error}") from error


def _verify(*, sandbox: Sandbox, task: CodeRepoTask, base: str, submitted: bool, open_sandbox: OpenSandbox,
            actions: Sequence[ToolCall], config: VerifierConfig) -> Verdict:
    started = time.monotonic()
    flag_policy = FlagPolicy.of(config)
    git = check_git(sandbox, base=base)
    tree = read_workspace(sandbox)
    with open_sandbox() as grader:
        public = _on_base(grader, task=task, base=base, spec=task.public_tests)
        diff, findings, changed = _submission(grader, task=task, base=base, tree=tree, actions=actions, config=config)
        if git.problems:
            findings.add(EpisodeFlag.GIT_HISTORY_REWRITTEN, "; ".join(git.problems))
        rules = _rules(submitted=submitted, diff=diff, findings=findings, started=started)
        layers = [rules]
        run_layers = rules.passed or (flag_policy.name != "zero" and submitted and bool(diff.strip()))
        if public is not None:
            layers.append(_layer(grader, public, "public_tests", findings, changed) if run_layers
                          else _not_run("public_tests"))
    if run_layers:
        why = unblinded_reason(task, enabled=config.blind_hidden_tests)
        key = None if why else reference_key(task, base=base, open_sandbox=open_sandbox)
        if key is None and task.canary:  # a canary without a key fails every test: it is never trained on
            key = unblinded_key(why, canary=True)
        with open_sandbox() as fresh:
            layers.append(_hidden(fresh, task=task, base=base, tree=tree, diff=diff, findings=findings,
                                  changed=changed, key=key, unblinded=why))
    else:
        layers.append(_not_run("hidden_tests"))
    flags = sorted(flag.value for flag in findings.flags)
    return Verdict(layers=layers, diff=diff.decode(errors="replace"), flags=flags)


def _on_base(sandbox: Sandbox, *, task: CodeRepoTask, base: str, spec: TestSpec | None) -> TestSpec | None:
    """Install the base in `sandbox`; a layer that names no tests gets the ids it collects on the
    base, so that a submission can neither add tests to pass nor hide the ones that fail."""
    graded_base = install_repo(sandbox, task)
    if graded_base != base:
        raise SetupError(f"the grader's base commit is {graded_base}, the worker recorded {base}")
    if spec is None or spec.tests:
        return spec
    return _with_base_ids(sandbox, task=task, base=base, spec=spec)


def _with_base_ids(sandbox: Sandbox, *, task: CodeRepoTask, base: str, spec: TestSpec,
                   files: dict[str, str] | None = None) -> TestSpec:
    """`spec` naming the ids it collects in `sandbox` (base, and the grader's `files`): computed once per
    task, image and base, where nothing of the agent's has run (memo.py)."""
    inputs = [sandbox.image, task.model_dump(mode="json"), base, spec.model_dump(mode="json"), files]
    ids = _collected.get_or_compute(inputs, lambda: collect_test_ids(sandbox, spec))
    return spec.model_copy(update={"tests": ids}) if ids else spec


def _submission(grader: Sandbox, *, task: CodeRepoTask, base: str, tree: bytes, actions: Sequence[ToolCall],
                config: VerifierConfig) -> tuple[bytes, monitors.Findings, frozenset[str]]:
    """Load the agent's files over the base in `grader`; the diff, everything the monitors found in
    it, and the paths the agent changed."""
    load_submission(grader, tree, base=base)
    raw = staged_diff(grader, base=base)
    if len(raw) > MAX_DIFF_BYTES:
        raise SubmissionError(f"the change is {len(raw) >> 20} MiB; expected at most {MAX_DIFF_BYTES >> 20} MiB")
    changes = changed_files(grader, base=base)
    protected = [*(config.protected_paths if config.protected_paths is not None else DEFAULT_PROTECTED),
                 *task.protected_paths]
    pythonpath = [path for spec in _pytest_layers(task) for path in spec.pythonpath]
    # Contents come from git's objects (the index, the base commit), never from the tree: a link
    # or a hard link cannot show the monitors one file and the interpreter another.
    new = staged_blobs(grader, [path for status, path in changes if status != "D"])
    old = staged_blobs(grader, [path for status, path in changes if status != "A"], base=base)
    try:
        findings = monitors.inspect_paths(changes, protected=protected, pythonpath=pythonpath,
                                          installed=_modules_of(grader))
        changed_paths = {path for _, path in changes}
        for path in sorted(_test_packages(task) & changed_paths):
            findings.add(EpisodeFlag.PROTECTED_PATHS, f"{path}: a package file the graded tests are imported "
                                                      "through (it runs before them)")
        for path, blob in new.items():
            kind = monitors.opaque_kind(blob.data)
            if blob.mode == SYMLINK_MODE:
                findings.add(EpisodeFlag.RESULT_FORGING, f"{path}: adds a symbolic link (to {blob.data[:100]!r})")
            elif kind:  # importable code the monitors cannot read: refused, never skipped
                findings.add(EpisodeFlag.RESULT_FORGING, f"{path}: {kind}, code the monitors cannot read")
            elif len(blob.data) > MAX_INSPECTED_BYTES:
                findings.add(EpisodeFlag.RESULT_FORGING, f"{path}: {len(blob.data) >> 20} MiB, over the "
                                                         f"{MAX_INSPECTED_BYTES >> 20} MiB the monitors read: not inspected")
            elif path.rsplit("/", 1)[-1] in CONFIG_FILES:
                findings.merge(monitors.inspect_config(path, new=blob.data, old=_data(old.get(path))))
            else:  # any file that parses as Python is read as Python
                findings.merge(monitors.inspect_python(path, new=blob.data, old=_data(old.get(path))))
        findings.merge(monitors.inspect_actions(actions))
    except Exception as error:  # hostile input the monitors choke on is the agent's doing, never a crash
        raise SubmissionError(f"the monitors could not read the change ({type(error).__name__}: {error})") from None
    return raw, findings, frozenset(path for _, path in changes)


def _modules_of(grader: Sandbox) -> frozenset[str]:
    """The modules the grader's image imports without the workspace: a fact of the image alone (the
    listing runs isolated, from /), asked once per image (memo.py)."""
    return _installed.get_or_compute([grader.image], lambda: installed_modules(grader))


def _test_packages(task: CodeRepoTask) -> set[str]:
    """Every __init__.py from a graded test's directory up to the root: pytest imports the tests through
    them, so they run first (a root one included, under pytest's default `prepend` import mode)."""
    paths = {"__init__.py"}
    for spec in _pytest_layers(task):
        for path in [*spec.collect_paths(), *spec.files]:
            parts = path.split("::", 1)[0].strip("/").split("/")
            parts = parts[:-1] if parts[-1].endswith(".py") else parts
            paths.update("/".join([*parts[:depth], "__init__.py"]) for depth in range(1, len(parts) + 1)
                         if parts[0] not in ("", "."))
    return paths


def _pytest_layers(task: CodeRepoTask) -> list[TestSpec]:
    """The layers pytest runs (a Harbor task's hidden layer is its own script)."""
    return [spec for spec in (task.hidden_tests, task.public_tests) if isinstance(spec, TestSpec)]


def _data(blob: Blob | None) -> bytes | None:
    return None if blob is None else blob.data


def _rules(*, submitted: bool, diff: bytes, findings: monitors.Findings, started: float) -> LayerResult:
    problems = []
    if not submitted:
        problems.append("no submission")
    if not diff.strip():
        problems.append("empty change")
    if findings.flags:
        problems.append("flagged: " + ", ".join(sorted(flag.value for flag in findings.flags)))
    detail = "; ".join(problems) or "ok"
    if findings.notes:
        detail += "\n" + "\n".join(f"- {note}" for note in findings.notes[:100])
    return LayerResult("rules", 0.0 if problems else 1.0, not problems, detail, time.monotonic() - started)


def _layer(sandbox: Sandbox, spec: TestSpec, name: str, findings: monitors.Findings,
           changed: frozenset[str], *, key: Key | None = None, unblinded: str = "") -> LayerResult:
    started = time.monotonic()
    run = run_tests(sandbox, spec, agent_files=changed, key=key, unblinded=unblinded)
    for flag in run.flags:
        findings.add(flag, f"{name}: {flag.description}")
    record = {"blinded": run.blinded, "graded": run.graded} if key is not None or unblinded else None
    return LayerResult(name, run.score, run.passed, run.detail, time.monotonic() - started, record=record)


def _hidden(fresh: Sandbox, *, task: CodeRepoTask, base: str, tree: bytes, diff: bytes,
            findings: monitors.Findings, changed: frozenset[str], key: Key | None, unblinded: str) -> LayerResult:
    """The hidden tests in a second fresh sandbox: base + the same files, checked to give the same diff
    byte for byte; the test ids of a layer that names none are collected on base + the test files.
    With `key`, the test files are the blinded ones: no expected value enters this sandbox."""
    started = time.monotonic()
    spec = task.hidden_tests
    if isinstance(spec, HarborTests):
        return _harbor(fresh, task=task, spec=spec, base=base, tree=tree, diff=diff, started=started)
    files = key.graded_files() if key is not None else spec.files
    if spec.tests:
        install_repo(fresh, task)
    else:
        _on_base(fresh, task=task, base=base, spec=None)
        if apply_patch(fresh, spec.patch or "", name="test patch") is None:
            _add_test_files(fresh, files)
            spec = _with_base_ids(fresh, task=task, base=base, spec=spec, files=files)
            if key is not None:  # the task's ids, not the graded files' neutral parametrize ids
                spec = spec.model_copy(update={"tests": [key.original(test) for test in spec.tests]})
    _load_same_diff(fresh, tree=tree, base=base, diff=diff)
    conflict = apply_patch(fresh, spec.patch or "", name="test patch")
    if conflict:
        return LayerResult("hidden_tests", 0.0, False, conflict, time.monotonic() - started)
    _add_test_files(fresh, files)
    if key is not None:  # the base commit holds the tests as the repository had them: no history to read
        forget_history(fresh)
    return _layer(fresh, spec, "hidden_tests", findings, changed, key=key, unblinded=unblinded)


def _harbor(fresh: Sandbox, *, task: CodeRepoTask, spec: HarborTests, base: str, tree: bytes, diff: bytes,
            started: float) -> LayerResult:
    """A Harbor task's tests/test.sh in a second fresh sandbox: base + the same files (the same diff, byte for
    byte), its history gone (Harbor's working directory has none), then tests/ where /tests leads."""
    install_repo(fresh, task)
    _load_same_diff(fresh, tree=tree, base=base, diff=diff)
    forget_history(fresh)
    run = run_harbor_tests(fresh, spec)
    return LayerResult("hidden_tests", run.score, run.passed, run.detail, time.monotonic() - started,
                       record={"blinded": run.blinded, "graded": run.graded})


def _load_same_diff(fresh: Sandbox, *, tree: bytes, base: str, diff: bytes) -> None:
    """The agent's files over the base in a second fresh sandbox, which must show the graded diff byte for byte."""
    load_submission(fresh, tree, base=base)
    if staged_diff(fresh, base=base) != diff:
        raise SetupError("the hidden-test sandbox's tree differs from the graded diff")


def _add_test_files(sandbox: Sandbox, files: dict[str, str]) -> None:
    if files:
        put_or_reject(sandbox, {f"{WORKSPACE}/{path}": content.encode() for path, content in files.items()})


def _not_run(name: str) -> LayerResult:
    return LayerResult(name, 0.0, False, "not run: the rules layer failed")


def _rejected(task: CodeRepoTask, why: str) -> Verdict:
    layers = [LayerResult("rules", 0.0, False, f"not gradable: {why}")]
    layers += [_not_run(name) for name in ("public_tests", "hidden_tests") if name != "public_tests" or task.public_tests]
    return Verdict(layers=layers)
