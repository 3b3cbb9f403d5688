"""Programs that run inside a code_repo sandbox, read by the worker as package resources."""
