#!/bin/bash
# Harbor convention: the agent worked in /app; write 1 (pass) or 0 (fail) to /logs/verifier/reward.txt.
if [ -f /app/hello.txt ] && [ "$(cat /app/hello.txt)" = "Hello, world!" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
