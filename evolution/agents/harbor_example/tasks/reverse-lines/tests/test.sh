#!/bin/bash
# Partial credit, as Harbor allows any reward in [0, 1]: 0.5 for the right lines in any order.
got=$(cat /app/reversed.txt 2>/dev/null)
if [ "$got" = "$(printf 'gamma\nbeta\nalpha')" ]; then
  echo 1 > /logs/verifier/reward.txt
elif [ -n "$got" ] && [ "$(sort <<< "$got")" = "$(printf 'alpha\nbeta\ngamma')" ]; then
  echo 0.5 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
