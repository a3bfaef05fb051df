#!/bin/sh
if [ "$EXPECT" = from-the-front-matter ] && [ "$(cat /logs/agent/answer 2>/dev/null)" = sandbox-env ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
