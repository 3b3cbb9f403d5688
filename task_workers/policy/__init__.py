"""Talking to the policy: vLLM's OpenAI-compatible server, token-exact across turns."""
