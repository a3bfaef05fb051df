#!/bin/sh
# Step c's (it has no tests of its own): a partial reward.
[ -f /tmp/state/c ] && [ ! -e /tests/b-only ] && echo 0.25 > /logs/verifier/reward.txt
