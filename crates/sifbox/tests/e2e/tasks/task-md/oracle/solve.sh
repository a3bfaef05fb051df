#!/bin/sh
# The prompt alone is /instruction.md; the front matter's env and user apply.
grep -q 'secret word' /instruction.md || exit 1
grep -q -e preamble -e reviewer -e --- /instruction.md && exit 1
[ "$(id -u)" = 1000 ] || exit 1
echo "$SANDBOX_VAR" > /logs/agent/answer
