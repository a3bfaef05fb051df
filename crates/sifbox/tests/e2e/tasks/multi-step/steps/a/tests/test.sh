#!/bin/sh
[ -f /tmp/state/a ] && [ -f /tests/helper.txt ] && echo 1 > /logs/verifier/reward.txt
echo "a ran" > /logs/verifier/a-was-here
