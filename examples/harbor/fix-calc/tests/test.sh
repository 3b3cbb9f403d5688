#!/bin/bash
# As Harbor's task template: run the tests, then the reward from their exit status.
cd /app
python3 -m pytest -q -p no:cacheprovider /tests/test_outputs.py -rA
if [ $? -eq 0 ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
