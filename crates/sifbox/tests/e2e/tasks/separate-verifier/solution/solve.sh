#!/bin/sh
# Handed over: the artifacts. Not handed over: the agent's logs, its files.
echo handed > /logs/artifacts/result
echo secret > /logs/agent/secret
echo state > /tmp/agent-state
# A reward planted for the verifier: /logs/verifier is read-only to the
# agent, so this fails (and the verifier's dir is made afresh anyway).
echo 0 > /logs/verifier/reward.txt 2>/dev/null
exit 0
