#!/bin/sh
[ "$GREETING" = hello-from-compose ] && [ "$(pwd)" = /work ] && [ "$(id -u)" = 1000 ] || exit 1
echo ok > /logs/agent/compose
