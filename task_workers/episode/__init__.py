"""The episode runner: lease a sandbox, set the task up, act/observe until done, verify, store."""
