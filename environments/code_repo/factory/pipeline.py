"""The factory's steps for one package: baseline, coverage, mutations, validation, tasks.

    lines, report = build_tasks("pypi:toolz==1.0.0", open_sandbox=open_sandbox, workdir=tmp)
    lines, report = build_tasks("./mylib", open_sandbox=open_sandbox, workdir=tmp, package_sandbox=on_package_image)

0. **Image.** A package that declares dependencies (requirements.py: its runtime ones and a test extra's),
   or is given some (`FactoryOptions.requirements`), gets its own image: the environment's plus those
   wheels (environments/images/packages.py), made by `package_sandbox`. Every sandbox below is then of
   that image, and so is every sandbox of its tasks (the task names it: `image`).

1. **Baseline.** The package's tests run twice in a fresh sandbox through the grader's own runner
   (grader.reference_run: the entry point, ini and report the hidden tests will be graded with). A test
   is kept when it passed both times; a package with none is reported, not fatal.
2. **Coverage.** One more run records the functions the tests entered (a profile hook), so that only
   code some kept test executes is mutated.
3. **Mutations** (mutations.py), in a seeded order, at most `max_mutations` per package.
4. **Validation.** Each mutant runs the kept tests in a fresh sandbox of its own. It is kept only when at
   least one kept test fails (FAIL_TO_PASS) and every other kept test passes (PASS_TO_PASS), with no
   collection error and within a time bound (five times the baseline's, at least 30 s).
5. **Tasks.** A code_repo task per kept mutant: the mutated tree as the repository (a tarball: the task's
   base commit is its only commit), hidden tests F2P + P2P graded `all`, public test the first failing
   test the instruction names, the original file as the reference solution. The instruction names the
   failing tests and their errors, never the file, the function, the line or the operator. Mutants whose
   files are equal, or whose F2P sets are, are kept once.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import random
import re
import tarfile
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from core.errors import ConfigError, CrucibleError
from environments.base import OpenSandbox, Sandbox
from environments.code_repo import monitors
from environments.code_repo.factory.mutations import OPERATORS, Mutation, mutations
from environments.code_repo.factory.requirements import declared
from environments.code_repo.factory.source import fetch, name_of
from environments.code_repo.grader import reference_run
from environments.code_repo.repo import SetupError, install_repo, installed_modules, matches
from environments.code_repo.snapshot import RepoSnapshot, check_snapshot
from environments.code_repo.task import TEST_FILES, CodeRepoTask, TestSpec, is_safe_argument

BASELINE_RUNS = 2
MIN_TIMEOUT_S = 30.0
MAX_LISTED_FAILURES = 5
NOT_LIBRARY = [*TEST_FILES, "setup.py", "noxfile.py", "conftest.py", "docs/*", "examples/*"]
"""Files the factory never mutates: the tests, their fixtures, build scripts, documentation."""


@dataclass(frozen=True)
class FactoryOptions:
    max_mutations: int = 300
    """Mutants validated per package (each a fresh sandbox and a test run)."""
    seed: int = 0
    jobs: int = 2
    """Mutants validated at once, each in its own sandbox."""
    split: str = "train"
    operators: tuple[str, ...] = OPERATORS
    baseline_timeout_s: float = 300.0
    requirements: tuple[str, ...] = ()
    """Installed for every package's tests besides what it declares (checked: requirements.check_requirements)."""


PackageSandbox = Callable[[str, list[str]], tuple[str, OpenSandbox]]
"""(package, requirements) → (its image's tag, a way to open a fresh sandbox of that image)."""


@dataclass
class PackageReport:
    """What the factory did with one package (one line of the factory's report)."""

    source: str
    package: str
    error: str | None = None
    requirements: list[str] = field(default_factory=list)
    image: str | None = None
    """The package's own image (it has requirements), else None: the environment's."""
    tests_collected: int = 0
    tests_kept: int = 0
    tests_unreliable: int = 0
    functions_covered: int = 0
    mutations_found: int = 0
    """Distinct mutants (their files differ) in the covered functions."""
    mutations_duplicate: int = 0
    """Mutants that wrote the same file as another, never tried."""
    tried: dict[str, int] = field(default_factory=dict)
    kept: dict[str, int] = field(default_factory=dict)
    rejected: dict[str, int] = field(default_factory=dict)
    tasks: int = 0
    seconds: float = 0.0

    @property
    def seconds_per_task(self) -> float | None:
        return round(self.seconds / self.tasks, 1) if self.tasks else None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self) | {"seconds_per_task": self.seconds_per_task}


@dataclass(frozen=True)
class Layout:
    pythonpath: list[str]
    test_files: list[str]


@dataclass(frozen=True)
class Outcome:
    mutation: Mutation
    verdict: str
    """`kept`, or why not (`no test fails`, `breaks collection`, `timed out`, ...)."""
    failing: tuple[str, ...] = ()
    messages: dict[str, str] = field(default_factory=dict)
    repo: RepoSnapshot | None = None
    """The mutated tree as validated (kept mutants): the task's repository, packed once."""


@dataclass
class FactoryReport:
    """What one factory run did: the tasks written to `out`, the wall-clock, and each package's report."""

    out: Path
    packages: list[PackageReport] = field(default_factory=list)
    tasks: int = 0
    minutes: float = 0.0

    @property
    def tasks_per_minute(self) -> float | None:
        return round(self.tasks / self.minutes, 2) if self.minutes else None

    def as_dict(self) -> dict[str, Any]:
        """The report as `<out>.report.json` and `crucible tasks factory --output json` write it."""
        return {"out": str(self.out), "tasks": self.tasks, "minutes": round(self.minutes, 1),
                "tasks_per_minute": self.tasks_per_minute, "packages": [report.as_dict() for report in self.packages]}


def run_factory(sources: list[str], *, open_sandbox: OpenSandbox, out: Path, options: FactoryOptions = FactoryOptions(),
                progress: Callable[[str], None] = lambda _: None,
                package_sandbox: PackageSandbox | None = None) -> FactoryReport:
    """build_tasks over `sources`, one after the other, the tasks written to `out` (JSONL) as each package
    finishes and the report to `<out>.report.json`; returns the report."""
    began = time.monotonic()
    report = FactoryReport(out=out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", encoding="utf-8") as handle:
        for source in sources:
            with tempfile.TemporaryDirectory(prefix="crucible-factory-") as workdir:
                lines, package = build_tasks(source, open_sandbox=open_sandbox, workdir=Path(workdir), options=options,
                                             progress=progress, package_sandbox=package_sandbox)
            for line in lines:
                handle.write(json.dumps(line) + "\n")
            handle.flush()
            report.tasks += len(lines)
            report.packages.append(package)
            if package.error:
                progress(package.error)
    report.minutes = (time.monotonic() - began) / 60
    Path(f"{out}.report.json").write_text(json.dumps(report.as_dict(), indent=2) + "\n")
    return report


def build_tasks(source: str, *, open_sandbox: OpenSandbox, workdir: Path, options: FactoryOptions = FactoryOptions(),
                progress: Callable[[str], None] = lambda _: None,
                package_sandbox: PackageSandbox | None = None) -> tuple[list[dict[str, Any]], PackageReport]:
    """Task lines (Crucible JSONL objects, repositories inline) and the report for one source. A package
    that cannot be fetched or whose tests do not run comes back with `report.error` (one line) and no
    tasks; it never raises for the package's own faults. `package_sandbox` makes the image of a package
    with requirements; without it such a package is reported, not built."""
    began = time.monotonic()
    report = PackageReport(source=source, package=name_of(source))
    try:
        lines = _build(source, open_sandbox=open_sandbox, workdir=workdir, options=options, report=report,
                       progress=progress, package_sandbox=package_sandbox)
    except (CrucibleError, SetupError) as error:
        report.error = f"{report.package}: {error}"
        lines = []
    except Exception as error:  # a package's fault (or ours on it) must not end the other packages
        report.error = f"{report.package}: {type(error).__name__}: {str(error)[:300]}"
        lines = []
    report.seconds = round(time.monotonic() - began, 1)
    report.tasks = len(lines)
    return lines, report


def _build(source: str, *, open_sandbox: OpenSandbox, workdir: Path, options: FactoryOptions, report: PackageReport,
           progress: Callable[[str], None], package_sandbox: PackageSandbox | None) -> list[dict[str, Any]]:
    root = fetch(source, into=workdir)
    files = _read_tree(root)
    layout = _layout(files)
    open_sandbox = _package_image(root, open_sandbox=open_sandbox, options=options, report=report, progress=progress,
                                  package_sandbox=package_sandbox)
    progress(f"{report.package}: {len(files)} files, tests in {len(layout.test_files)} files")
    spec, covered = _kept_tests(files, layout, open_sandbox=open_sandbox, options=options, report=report)
    chosen = _chosen_mutations(files, covered, options=options, report=report)
    progress(f"{report.package}: {len(spec.tests)} tests kept, {report.functions_covered} functions covered, "
             f"{report.mutations_found} mutations, validating {len(chosen)}")
    return _validated_tasks(chosen, files, spec, open_sandbox=open_sandbox, options=options, report=report,
                            progress=progress)


def _package_image(root: Path, *, open_sandbox: OpenSandbox, options: FactoryOptions, report: PackageReport,
                   progress: Callable[[str], None], package_sandbox: PackageSandbox | None) -> OpenSandbox:
    """The sandboxes the package's tests run in: of its own image when it has requirements (declared or
    given), else `open_sandbox`'s."""
    report.requirements = list(dict.fromkeys([*declared(root), *options.requirements]))
    if report.requirements:
        if package_sandbox is None:
            raise ConfigError(f"its tests need {', '.join(report.requirements)}; expected a way to build its image "
                              "(crucible tasks factory builds one), got none")
        report.image, open_sandbox = package_sandbox(report.package, report.requirements)
        progress(f"{report.package}: image {report.image} with {', '.join(report.requirements)}")
    return open_sandbox


def _kept_tests(files: dict[str, bytes], layout: Layout, *, open_sandbox: OpenSandbox, options: FactoryOptions,
                report: PackageReport) -> tuple[TestSpec, dict[str, set[int]]]:
    """The layer that grades the tests kept (they passed every baseline run, then twice more as the graded
    runs collect them) and the functions the baseline's tests entered, by file."""
    selected, collected, unreliable, baseline_s, covered = _baseline(files, layout, open_sandbox=open_sandbox,
                                                                     timeout_s=options.baseline_timeout_s)
    # The graded runs collect only the kept tests' files: the unmutated tree must pass them that way too,
    # and twice more (a test that fails now and then would make a mutant that changes nothing look caught).
    timeout = max(MIN_TIMEOUT_S, 5 * baseline_s)
    spec = TestSpec(tests=selected, pythonpath=layout.pythonpath, timeout_s=min(timeout, 3600), scoring="all")
    before = len(selected)
    selected = _passing_as_graded(files, spec, open_sandbox=open_sandbox) if selected else []
    unreliable += before - len(selected)
    spec = spec.model_copy(update={"tests": selected})
    report.tests_collected, report.tests_kept, report.tests_unreliable = collected, len(selected), unreliable
    if not selected:
        raise ConfigError(f"no test passed every baseline run out of {collected} collected")
    report.functions_covered = sum(len(lines) for lines in covered.values())
    return spec, covered


def _chosen_mutations(files: dict[str, bytes], covered: dict[str, set[int]], *, options: FactoryOptions,
                      report: PackageReport) -> list[Mutation]:
    """The mutants to validate: the distinct ones of the covered functions, in a seeded order, at most
    `options.max_mutations`."""
    found = [m for path, data in sorted(files.items()) if path in covered and (text := _utf8(data)) is not None
             for m in mutations(path, text, covered=covered[path], operators=options.operators)]
    distinct: dict[str, Mutation] = {}
    for mutation in found:  # two operators can write the same file (e.g. `x - 1` → `x + 1` and `x - -1`…)
        distinct.setdefault(_digest(mutation, files), mutation)
    report.mutations_duplicate = len(found) - len(distinct)
    found = list(distinct.values())
    report.mutations_found = len(found)
    random.Random(f"{report.package}:{options.seed}").shuffle(found)
    return found[:options.max_mutations]


def _validated_tasks(chosen: list[Mutation], files: dict[str, bytes], spec: TestSpec, *, open_sandbox: OpenSandbox,
                     options: FactoryOptions, report: PackageReport,
                     progress: Callable[[str], None]) -> list[dict[str, Any]]:
    """Validate `chosen` (`options.jobs` at once) and write a task line for each mutant kept, once per set of
    failing tests; what was tried, kept and rejected, by operator and reason, into `report`."""
    def validate(mutation: Mutation) -> Outcome:
        try:
            return _validate(mutation, files, spec, open_sandbox=open_sandbox)
        except Exception as error:  # one mutant's fault is that mutant's rejection
            return Outcome(mutation, f"error: {type(error).__name__}")

    tried: Counter[str] = Counter()
    kept: Counter[str] = Counter()
    rejected: Counter[str] = Counter()
    lines: list[dict[str, Any]] = []
    seen_failing: set[frozenset[str]] = set()
    with ThreadPoolExecutor(max_workers=max(1, options.jobs), thread_name_prefix="factory") as pool:
        for done, outcome in enumerate(pool.map(validate, chosen), 1):
            if done % 25 == 0:
                progress(f"{report.package}: {done}/{len(chosen)} validated, {len(lines)} tasks")
            mutation = outcome.mutation
            tried[mutation.operator] += 1
            verdict = outcome.verdict
            if verdict == "kept":
                if frozenset(outcome.failing) in seen_failing:
                    verdict = "same failing tests as another mutant"
                else:
                    seen_failing.add(frozenset(outcome.failing))
            if verdict != "kept":
                rejected[verdict] += 1
                continue
            kept[mutation.operator] += 1
            task_id = f"{report.package}.s{options.seed}.{len(lines) + 1:04d}"  # says nothing of the bug
            lines.append(_task_line(task_id, report.package, outcome, files=files, spec=spec, split=options.split,
                                    image=report.image))
    report.tried, report.kept, report.rejected = dict(tried), dict(kept), dict(rejected)
    return lines


def _digest(mutation: Mutation, files: dict[str, bytes]) -> str:
    """What a mutant's repository differs by: its path and the mutated file's bytes."""
    return hashlib.sha256(mutation.path.encode() + b"\0" + mutation.apply(files[mutation.path].decode()).encode()).hexdigest()


def _utf8(data: bytes) -> str | None:
    try:
        return data.decode()
    except UnicodeDecodeError:
        return None


def _read_tree(root: Path) -> dict[str, bytes]:
    files: dict[str, bytes] = {}
    for path in sorted(root.rglob("*")):
        if path.is_file() and not path.is_symlink():
            files[path.relative_to(root).as_posix()] = path.read_bytes()
    if not files:
        raise ConfigError("expected a project, got an empty tree")
    return files


def _layout(files: dict[str, bytes]) -> Layout:
    tests = sorted(path for path in files if path.endswith(".py") and matches(path, TEST_FILES[:2])
                   and is_safe_argument(path) and "::" not in path)
    if not tests:
        raise ConfigError("expected test files (test_*.py or *_test.py), found none")
    # A src layout puts its package under src/; the root stays on the path for tests that import helpers there.
    pythonpath = ["src", "."] if any(path.startswith("src/") and path.endswith(".py") for path in files) else ["."]
    return Layout(pythonpath=pythonpath, test_files=tests)


def _snapshot(files: dict[str, bytes]) -> RepoSnapshot:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz", compresslevel=6) as tar:
        directories: set[str] = set()
        for path, data in sorted(files.items()):
            parts = path.split("/")[:-1]
            for depth in range(1, len(parts) + 1):
                directory = "/".join(parts[:depth])
                if directory not in directories:
                    directories.add(directory)
                    info = tarfile.TarInfo(directory)
                    info.type, info.mode = tarfile.DIRTYPE, 0o755
                    tar.addfile(info)
            info = tarfile.TarInfo(path)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    snapshot = RepoSnapshot(format="tar", data_b64=base64.b64encode(buffer.getvalue()).decode())
    check_snapshot(snapshot)
    return snapshot


TRACE = r'''
import json, os, sys, threading
root, out, paths = "/workspace/", sys.argv[1], sys.argv[2].split(":")
seen = set()
def profile(frame, event, arg):
    if event == "call":
        code = frame.f_code
        if code.co_filename.startswith(root):
            seen.add((code.co_filename[len(root):], code.co_firstlineno))
sys.path[:0] = [os.path.normpath(root + p) for p in paths]
threading.setprofile(profile)
sys.setprofile(profile)
import pytest
pytest.main(["-q", "-p", "no:cacheprovider", "-c", out + ".ini", "--rootdir=/workspace", *sys.argv[3:]])
sys.setprofile(None)
with open(out, "w") as handle:
    json.dump(sorted(seen), handle)
'''


def _baseline(files: dict[str, bytes], layout: Layout, *, open_sandbox: OpenSandbox, timeout_s: float,
              ) -> tuple[list[str], int, int, float, dict[str, set[int]]]:
    """(tests passed in every baseline run, tests collected, tests that did not pass every time, slowest
    run's seconds, {library file: first lines of the functions the tests entered})."""
    spec = TestSpec(tests=[], paths=layout.test_files, pythonpath=layout.pythonpath, timeout_s=timeout_s)
    task = CodeRepoTask(repo=_snapshot(files), hidden_tests=spec)
    passed: list[set[str]] = []
    collected: set[str] = set()
    slowest = 0.0
    with open_sandbox() as sandbox:
        install_repo(sandbox, task)
        shipped = _top_level_modules(files, layout) & installed_modules(sandbox)
        if shipped:  # the image's copy is the original: an agent would diff against it
            raise ConfigError(f"the sandbox image already has {', '.join(sorted(shipped))} installed: its original "
                              "code would sit beside every task (pick another package or version, or another image)")
        for _ in range(BASELINE_RUNS):
            began = time.monotonic()
            report, log = reference_run(sandbox, spec)
            slowest = max(slowest, time.monotonic() - began)
            if report is None:
                raise ConfigError(f"the test suite did not run to a report (timed out after {timeout_s:.0f} s, "
                                  f"or crashed): {_last_line(log)}")
            real = [test for test in report.get("collected") or [] if not _is_canary(str(test), files)]
            if report.get("collect_errors") and not real:  # the grader's canaries collect whatever happens
                missing = re.search(r"(?:ModuleNotFoundError|ImportError): [^\n]{1,200}", log)
                raise ConfigError(f"the tests do not collect ({', '.join(report['collect_errors'][:3])}): "
                                  f"{missing.group(0) if missing else _last_line(log)}"
                                  + (" (declare it, or pass --with PACKAGE)" if missing else ""))
            outcomes = report["outcomes"]
            collected |= {str(test) for test in report["collected"]}
            passed.append({str(test) for test, outcome in outcomes.items() if outcome == "passed"})
        covered = _coverage(sandbox, layout, files, timeout_s=timeout_s)
    passed = [{test for test in run if not _is_canary(test, files)} for run in passed]
    reliable = set.intersection(*passed)
    selected = sorted(test for test in reliable if is_safe_argument(test))
    counted = {test for test in collected if not _is_canary(test, files)}
    unreliable = len(set.union(*passed) - reliable)
    return selected, len(counted), unreliable, slowest, covered


def _top_level_modules(files: dict[str, bytes], layout: Layout) -> set[str]:
    """The importable names the package's tree defines at the roots of its pythonpath (its own, not tests')."""
    names = set()
    for root in layout.pythonpath:
        prefix = "" if root in (".", "") else root.rstrip("/") + "/"
        for path in files:
            if not path.startswith(prefix) or matches(path, NOT_LIBRARY):
                continue
            parts = path[len(prefix):].split("/")
            if len(parts) == 1 and parts[0].endswith(".py"):
                names.add(parts[0].removesuffix(".py"))
            elif len(parts) == 2 and parts[1] == "__init__.py":
                names.add(parts[0])
    return names


def _is_canary(test: str, files: dict[str, bytes]) -> bool:
    """The grader's canaries run beside the tests; their files are not the package's."""
    return test.split("::", 1)[0] not in files


def _coverage(sandbox: Sandbox, layout: Layout, files: dict[str, bytes], *, timeout_s: float) -> dict[str, set[int]]:
    out = "/tmp/crucible-factory-trace.json"
    sandbox.put_files({f"{out}.ini": b"[pytest]\naddopts =\n", "/tmp/crucible-factory-trace.py": TRACE.encode()})
    ran = sandbox.exec(["env", "PYTEST_DISABLE_PLUGIN_AUTOLOAD=1", "python3", "-B", "/tmp/crucible-factory-trace.py", out,
                        ":".join(layout.pythonpath), *layout.test_files], timeout_s=timeout_s + 60)
    if ran.timed_out:
        raise ConfigError(f"the coverage run (the tests under a profile hook) took over {timeout_s + 60:.0f} s")
    read = sandbox.exec(["cat", out], timeout_s=60)
    try:
        entered = json.loads(bytes(read.output))
    except (ValueError, RecursionError):
        raise ConfigError(f"the coverage run wrote no record (exit {ran.exit_code})") from None
    if not isinstance(entered, list) or not all(isinstance(item, list) and len(item) == 2 for item in entered):
        raise ConfigError("the coverage run's record is not a list of [file, line] pairs (the tests overwrote it?)")
    covered: dict[str, set[int]] = {}
    for path, line in entered:
        if isinstance(path, str) and isinstance(line, int) and path in files and path.endswith(".py") \
                and not matches(path, NOT_LIBRARY):
            covered.setdefault(path, set()).add(line)
    return covered


def _validate(mutation: Mutation, files: dict[str, bytes], spec: TestSpec, *, open_sandbox: OpenSandbox) -> Outcome:
    original = files[mutation.path].decode()
    mutated = {**files, mutation.path: mutation.apply(original).encode()}
    # The fix puts the original back: if the hack monitors would flag that change (a removed `exec`, a
    # `sys._getframe` call), an honest agent's fix scores 0 and the task cannot be solved.
    if monitors.inspect_python(mutation.path, new=original.encode(), old=mutated[mutation.path]).flags:
        return Outcome(mutation, "its fix trips the hack monitors")
    task = CodeRepoTask(repo=_snapshot(mutated), hidden_tests=spec)
    try:
        with open_sandbox() as sandbox:
            install_repo(sandbox, task)
            report, log = reference_run(sandbox, spec)
    except (CrucibleError, SetupError) as error:
        return Outcome(mutation, f"sandbox fault: {type(error).__name__}")
    if report is None:
        return Outcome(mutation, "timed out or crashed")
    if report.get("collect_errors"):
        return Outcome(mutation, "breaks collection")
    failing = _failing(report, spec)
    if not failing:
        return Outcome(mutation, "no test fails")
    if any(report["outcomes"].get(test) not in ("failed", "error") for test in failing):
        return Outcome(mutation, "a kept test was skipped or not run")
    with open_sandbox() as again:  # the same failures in a fresh sandbox, or the mutant is not kept
        install_repo(again, task)
        second, _ = reference_run(again, spec)
    if second is None or _failing(second, spec) != failing:
        return Outcome(mutation, "different failures when run again")
    assert isinstance(task.repo, RepoSnapshot)  # the factory packs every mutant as an archive
    return Outcome(mutation, "kept", failing=failing, messages=_messages(log), repo=task.repo)


def _failing(report: dict[str, Any], spec: TestSpec) -> tuple[str, ...]:
    return tuple(test for test in spec.tests if report["outcomes"].get(test) != "passed")


def _passing_as_graded(files: dict[str, bytes], spec: TestSpec, *, open_sandbox: OpenSandbox) -> list[str]:
    """The tests of `spec` that pass on the unmutated tree in each of BASELINE_RUNS fresh sandboxes, run as
    a mutant's are (only the kept tests' files collected)."""
    task = CodeRepoTask(repo=_snapshot(files), hidden_tests=spec)
    passing = set(spec.tests)
    for _ in range(BASELINE_RUNS):
        with open_sandbox() as sandbox:
            install_repo(sandbox, task)
            report, log = reference_run(sandbox, spec)
        if report is None:
            raise ConfigError(f"the kept tests did not run to a report on their own: {_last_line(log)}")
        passing -= set(_failing(report, spec))
    return [test for test in spec.tests if test in passing]


_SUMMARY = re.compile(r"^(?:FAILED|ERROR) (.+?)(?: - (.*))?$")  # ids may hold spaces (parametrized)
_SECTION = re.compile(r"^_{3,} (.+?) _{3,}$")


def _messages(log: str) -> dict[str, str]:
    """Test id → its error's first line: from the runner's short summary (`FAILED id - message`), or,
    where the summary cut it short (`...`) or gave none, the first `E` line of the test's traceback."""
    details: dict[str, str] = {}
    summary: dict[str, str] = {}
    current = None
    for raw in log.splitlines():
        line = raw.rstrip()
        section = _SECTION.match(line)
        if section:
            current = section[1]
        elif current and line.startswith("E ") and current not in details:
            details[current] = line[1:].strip()
        match = _SUMMARY.match(line.strip())
        if match:
            summary[match[1]] = (match[2] or "").strip()
    found: dict[str, str] = {}
    for test, message in summary.items():
        if not message or message.endswith("..."):
            message = details.get(test.split("::", 1)[-1].replace("::", "."), message)
        found[test] = message[:300]
    return found


def _last_line(log: str) -> str:
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    return (lines[-1] if lines else "no output")[:200]


def instruction(package: str, failing: tuple[str, ...], messages: dict[str, str]) -> str:
    """What the agent is told: which tests fail and how, never where the bug is or what it is."""
    listed = [f"- {test}" + (f": {messages[test]}" if messages.get(test) else "") for test in failing[:MAX_LISTED_FAILURES]]
    more = len(failing) - MAX_LISTED_FAILURES
    if more > 0:
        listed.append(f"- and {more} more")
    return (f"After a recent change to {package}, {len(failing)} of its tests fail that passed before:\n"
            + "\n".join(listed)
            + "\n\nFind the bug in the library code and fix it so that these tests pass again. Do not change the "
              "tests; every other test must keep passing.")


def _task_line(task_id: str, package: str, outcome: Outcome, *, files: dict[str, bytes], spec: TestSpec, split: str,
               image: str | None = None) -> dict[str, Any]:
    mutation = outcome.mutation
    assert outcome.repo is not None  # a kept mutant's
    passing = [test for test in spec.tests if test not in outcome.failing]
    hidden = TestSpec(tests=[*outcome.failing, *passing], pythonpath=spec.pythonpath, timeout_s=spec.timeout_s,
                      scoring="all")
    public = TestSpec(tests=[outcome.failing[0]], pythonpath=spec.pythonpath, timeout_s=spec.timeout_s)
    return {
        "id": task_id,
        "instruction": instruction(package, outcome.failing, outcome.messages),
        "split": split,
        **({"image": image} if image else {}),
        "repo": outcome.repo.model_dump(mode="json"),
        "public_tests": public.model_dump(mode="json", exclude_defaults=True),
        "hidden_tests": hidden.model_dump(mode="json", exclude_defaults=True),
        "solution": {"files": {mutation.path: files[mutation.path].decode()}},
        "factory": {"package": package, "mutation": mutation.key, "operator": mutation.operator, "file": mutation.path,
                    "function": mutation.function, "line": mutation.line, "fail_to_pass": list(outcome.failing),
                    "pass_to_pass": len(passing)},
    }
