#!/bin/bash
expected=$(wc -w < /app/essay.txt | tr -d '[:space:]')
if [ "$(tr -d '[:space:]' < /app/count.txt 2>/dev/null)" = "$expected" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
