#!/bin/sh
# The sandbox persists; each step's logs and tests are its own.
fail() { echo "$1"; echo 0 > /logs/verifier/reward.txt; exit 0; }
[ -f /tmp/state/a ] && [ -f /tmp/state/b ] || fail "the sandbox did not persist"
[ ! -e /logs/verifier/a-was-here ] || fail "step a's verifier/ is visible"
[ -f /tests/helper.txt ] || fail "tests/ was not merged under the step's"
[ "$STEP_SAYS" = b ] || fail "no step env"
echo '{"reward": 1, "b_only": 1}' > /logs/verifier/reward.json
