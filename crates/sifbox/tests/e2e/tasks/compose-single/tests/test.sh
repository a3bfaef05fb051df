#!/bin/sh
# The service's command was started before the agent: give it a moment.
for _ in 1 2 3 4 5 6 7 8 9 10; do [ -s /tmp/service-ran ] && break; sleep 0.2; done
if [ "$(cat /tmp/service-ran 2>/dev/null)" != "started as 1000 in /work" ]; then
  echo "the service's command did not run: $(cat /tmp/service-ran 2>&1)"
  echo 0 > /logs/verifier/reward.txt
  exit 0
fi
if [ "$GREETING" = hello-from-compose ] && [ "$FROM_TOML" = toml ] && [ "$(pwd)" = /work ] \
  && [ "$(id -u)" = 1000 ] && [ "$(cat /etc/built-here)" = yes ] \
  && [ "$(cat /logs/agent/compose 2>/dev/null)" = ok ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
