"""Crucible's grader: pytest with a per-test report (argv: run.py REPORT_FD MODE PYTEST_ARGS...;
MODE is `graded`, or `reference` for the trusted run on the reference solution).
Written by the grader's keeper uid, read-only to the tests. REPORT_FD is a pipe inherited from the
grader's root wrapper, opened before anything of the workspace is imported; no path leads to it."""
import builtins
import json
import os
import stat
import sys

import pytest
from _pytest import python as _python
from _pytest import reports as _reports
from _pytest import runner as _runner

# The observer (sandbox/observer.py) runs in a namespace of its own: what it puts into builtins for the
# rewritten tests leads to its own state (what the checks observed), never to the report below.
_OBSERVER = {"__name__": "crucible_observer", "__builtins__": builtins}
exec(compile("OBSERVER_SOURCE", "<crucible-observer>", "exec"), _OBSERVER)


def _internals():
    """What a forger would patch to pass tests without running them, by identity."""
    return {
        "Function.runtest": vars(_python.Function).get("runtest"),
        "pytest_pyfunc_call": getattr(_python, "pytest_pyfunc_call", None),
        "runtestprotocol": getattr(_runner, "runtestprotocol", None),
        "call_and_report": getattr(_runner, "call_and_report", None),
        "call_runtest_hook": getattr(_runner, "call_runtest_hook", None),
        "runner.pytest_runtest_makereport": getattr(_runner, "pytest_runtest_makereport", None),
        "CallInfo.from_call": vars(_runner.CallInfo).get("from_call"),
        "TestReport.from_item_and_call": vars(_reports.TestReport).get("from_item_and_call"),
        "TestReport.__init__": vars(_reports.TestReport).get("__init__"),
        "BaseReport.__init__": vars(_reports.BaseReport).get("__init__"),
        "CallInfo.__init__": vars(_runner.CallInfo).get("__init__"),
        "runner.check_interactive_exception": getattr(_runner, "check_interactive_exception", None),
    }


# The runner's hooks whose implementations decide an outcome: after configuration, only conftest modules
# (protected paths) may add to them.
_DECISIVE = ("pytest_pyfunc_call", "pytest_runtest_call", "pytest_runtest_protocol", "pytest_runtest_makereport",
             "pytest_report_teststatus", "pytest_runtest_logreport", "pytest_runtest_setup", "pytest_collection_modifyitems")
_write, _fstat, _exit = os.write, os.fstat, os._exit


def _is_conftest(plugin):
    return type(plugin) is type(os) and os.path.basename(str(getattr(plugin, "__file__", ""))) == "conftest.py"


def _is_runner_own(plugin):
    """One of pytest's own plugin objects (a class of a _pytest module, as that module defines it)."""
    cls = plugin if isinstance(plugin, type) else type(plugin)
    module = sys.modules.get(getattr(cls, "__module__", "") or "")
    return (module is not None and module.__name__.startswith("_pytest.")
            and getattr(module, getattr(cls, "__qualname__", ""), None) is cls)


class CrucibleReport:
    def __init__(self, fd):
        # The keeper reads the other end; nobody else can write the report file it makes.
        if not stat.S_ISFIFO(os.fstat(fd).st_mode):
            raise SystemExit(f"grader: expected the report pipe on descriptor {fd}")
        self.fd = fd
        self.pipe = (os.fstat(fd).st_dev, os.fstat(fd).st_ino)
        os.set_inheritable(fd, False)  # not passed on to anything the tests start
        self.internals = _internals()
        self.known_plugins = None
        self.collected, self.outcomes, self.repeated, self.collect_errors, self.tampered = [], {}, [], [], []
        self.calls = {"passed": 0, "failed": 0}

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item, nextitem):
        _OBSERVER["state"]["test"] = item.nodeid
        yield
        _OBSERVER["state"]["test"] = "<between tests>"

    def pytest_configure(self, config):
        self.manager = config.pluginmanager
        self.known_plugins = {id(plugin) for plugin in self.manager.get_plugins()}
        self.configured = set(self.known_plugins)
        self.own_types = set()

    def _check(self, when):
        now = _internals()
        self.tampered += [f"{name} was replaced ({when})" for name, value in self.internals.items()
                          if now[name] is not value and f"{name} was replaced" not in " ".join(self.tampered)]
        for plugin in self.manager.get_plugins():
            if id(plugin) in self.known_plugins:
                continue
            self.known_plugins.add(id(plugin))
            cls = plugin if isinstance(plugin, type) else type(plugin)
            if _is_conftest(plugin):
                continue
            if _is_runner_own(plugin) and cls not in self.own_types:  # refused by count: each of pytest's once
                self.own_types.add(cls)
                continue
            name = str(getattr(plugin, "__file__", None) or getattr(cls, "__qualname__", "?"))[:200]
            self.tampered.append(f"a plugin was registered after configuration: {name} ({when})")
        for hook in _DECISIVE:
            for impl in getattr(self.manager.hook, hook).get_hookimpls():
                if id(impl.plugin) not in self.configured and not _is_conftest(impl.plugin) \
                        and not _is_runner_own(impl.plugin):
                    self.tampered.append(f"{hook} is implemented by a plugin added after configuration ({when})")

    def pytest_runtest_logstart(self, nodeid, location):
        if len(self.outcomes) % 50 == 0:
            self._check("a test")

    def pytest_collectreport(self, report):
        if report.failed:
            self.collect_errors.append(report.nodeid)

    def pytest_collection_finish(self, session):
        self._check("collection")
        self.collected = [item.nodeid for item in session.items]

    def pytest_runtest_logreport(self, report):
        current = self.outcomes.get(report.nodeid)
        if report.when == "setup":
            if current is not None:
                self.repeated.append(report.nodeid)
            outcome = "skipped" if report.skipped else "error" if report.failed else "set-up"
        elif report.when == "call":
            if current != "set-up":
                self.repeated.append(report.nodeid)
            if hasattr(report, "wasxfail"):
                outcome = "xfail"
            else:
                outcome = "passed" if report.passed else "skipped" if report.skipped else "failed"
                if outcome in self.calls:  # what pytest's own summary counts as passed / failed
                    self.calls[outcome] += 1
        elif report.failed:
            outcome = "error"
        else:
            return
        self.outcomes[report.nodeid] = outcome

    def pytest_sessionfinish(self, session, exitstatus):
        self._check("the run")

    def send(self, code):
        data = json.dumps({"collected": self.collected, "outcomes": self.outcomes, "repeated": self.repeated,
                           "collect_errors": self.collect_errors, "tampered": self.tampered,
                           "observations": _OBSERVER["observations"], "calls": self.calls, "exitstatus": code,
                           **({"ledger": _OBSERVER["ledger_report"]()} if MODE == "reference" else {})}).encode() + b"\n"
        try:  # the descriptor must still be the pipe it was: one pointed elsewhere is a failed run
            now = _fstat(self.fd)
            if (now.st_dev, now.st_ino) != self.pipe:
                _exit(71)
            while data:
                data = data[_write(self.fd, data):]
        except OSError:
            _exit(70)


report = CrucibleReport(int(sys.argv[1]))
MODE = sys.argv[2]
builtins.__crucible_check__ = _OBSERVER["check"]
builtins.__crucible_raises__ = _OBSERVER["raises"]
builtins.__crucible_raises_call__ = _OBSERVER["raises_call"]
if MODE == "reference":  # the trusted run: what each leaf was computed from, where each import's module lives
    builtins.__crucible_leaf__, builtins.__crucible_mark__ = _OBSERVER["leaf"], _OBSERVER["mark"]
    builtins.__crucible_origin__ = _OBSERVER["origin"]
    _OBSERVER["start_reference"]()
code = int(pytest.main(sys.argv[3:], plugins=[report]))
for stream in (sys.stdout, sys.stderr):  # the runner's summary reaches the log before we leave
    try:
        stream.flush()
    except Exception:
        pass
report.send(code)
os._exit(code)  # no thread, atexit handler or finaliser of the code under test runs after the report
# Lint directives, below: grader.py sends the test process only the program above this line, with
# repr(observations.OBSERVER) (sandbox/observer.py's source) in place of "OBSERVER_SOURCE".
# ruff: noqa: SIM105  # the program is kept byte for byte as it ran (contextlib.suppress would change it)
# It runs as a script in the test process, where the builtins it sets and the observer's callables exist:
# mypy: disable-error-code="attr-defined, operator"
