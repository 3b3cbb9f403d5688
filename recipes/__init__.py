"""End-to-end recipes built on the library, each runnable as `python -m recipes.<name>`: `demo` (`make
demo`: read_number), `browser_rl` (`make rl-browser`: MiniWoB++ pages) and `mixed_rl` (`make rl-mixed`:
a code repo and a chat environment in one run). What they share (settings, set-up, the SFT warm-up, the
processes, evaluation, the live view) is in `recipes.common`."""
