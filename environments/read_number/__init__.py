"""read_number: find the number a file holds and submit it (the demo's learnable multi-turn task)."""
