#!/bin/sh
# Reward 1 only in the verifier's own image, with the agent's artifacts and
# nothing else of the agent's sandbox.
fail() { echo "$1"; echo 0 > /logs/verifier/reward.txt; exit 0; }
[ "$(cat /etc/image-of)" = verifier ] || fail "not in the verifier's image: $(cat /etc/image-of)"
[ "$(cat /logs/artifacts/result)" = handed ] || fail "no artifact handed over"
[ ! -e /logs/agent/secret ] || fail "the agent's logs are visible"
[ ! -e /tmp/agent-state ] || fail "the agent's files are visible"
[ ! -e /logs/verifier/reward.txt ] || fail "a reward was there before the verifier ran"
! touch /logs/artifacts/mine 2>/dev/null || fail "the artifacts are writable"
echo 1 > /logs/verifier/reward.txt
