#!/bin/sh
grep -q "Step c" /instruction.md && touch /tmp/state/c
