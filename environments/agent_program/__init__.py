"""The agent_program kind: an unmodified agent program plays a code_repo task inside the sandbox, its model
calls going through a per-episode gateway (task_workers/episode/program.py); graded as code_repo."""
