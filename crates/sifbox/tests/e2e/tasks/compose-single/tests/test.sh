#!/bin/sh
if [ "$GREETING" = hello-from-compose ] && [ "$FROM_TOML" = toml ] && [ "$(pwd)" = /work ] \
  && [ "$(id -u)" = 1000 ] && [ "$(cat /etc/built-here)" = yes ] \
  && [ "$(cat /logs/agent/compose 2>/dev/null)" = ok ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
