"""Harbor tasks in and out (https://harborframework.com's task format, read by the `harbor` package itself).

    crucible tasks import ENV DIR... --format harbor      # read by harbor, image built, tasks stored
    crucible tasks export ENV OUT --format harbor         # written to the format, read back by harbor

A Harbor task is a folder: `instruction.md`, `task.toml`, `environment/` (a Dockerfile), `tests/test.sh` (writes
the reward) and `solution/solve.sh`. It becomes a code_repo task (so any code_repo or agent_program environment
plays it): its image is the environment's, adapted (images.py: the task's working directory a link to the
workspace, /tests and /logs links into the grading sandbox's scratch), its workspace the working directory's
files, and its graded layer the task's own tests/test.sh, run only in a fresh grading sandbox with the
submission loaded (environments/code_repo/harbor_tests.py).

Every `harbor` release needs Python 3.12 or newer, and Crucible runs on 3.11: the package runs in an image of its
own (reader.py: Debian 13's Python 3.13 with harbor's wheels), with no network, reading the folders mounted
read-only; what it parsed comes back as JSON.
"""
