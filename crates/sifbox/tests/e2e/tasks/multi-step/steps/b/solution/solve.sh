#!/bin/sh
grep -q "Step b" /instruction.md && [ ! -e /logs/agent/a-log ] && [ ! -e /logs/steps ] && touch /tmp/state/b
