#!/bin/sh
fail() { echo "$1"; echo 0 > /logs/verifier/reward.txt; exit 0; }
[ "$(cat /etc/image-of)" = task ] || fail "not in the task's image"
[ "$(cat /logs/artifacts/out/result)" = handed ] || fail "no artifact handed over"
[ ! -e /etc/agent-state ] || fail "the agent's sandbox, not a fresh one"
echo 1 > /logs/verifier/reward.txt
