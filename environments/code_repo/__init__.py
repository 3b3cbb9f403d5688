"""The `code_repo` environment: fix a repository so that its hidden tests pass."""
