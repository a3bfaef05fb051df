#!/bin/sh
mkdir -p /tmp/state && echo a > /tmp/state/a
echo log > /logs/agent/a-log
