#!/bin/sh
mkdir -p /logs/artifacts/out
echo handed > /logs/artifacts/out/result
echo state > /etc/agent-state
