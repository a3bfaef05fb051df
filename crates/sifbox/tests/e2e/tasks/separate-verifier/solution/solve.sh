#!/bin/sh
# Handed over: the artifacts. Not handed over: the agent's logs, its files.
echo handed > /logs/artifacts/result
echo secret > /logs/agent/secret
echo state > /tmp/agent-state
echo 0 > /logs/verifier/reward.txt
