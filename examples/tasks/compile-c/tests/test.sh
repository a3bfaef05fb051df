#!/bin/bash
# Reward 1 when /src/collatz is a compiled program that gives 111 for 27
# and answer.txt holds 111.
cd /src || exit 1
ok=1
if ! head -c 4 collatz 2>/dev/null | grep -q 'ELF'; then
    echo "FAIL: /src/collatz is not an ELF executable"
    ok=0
elif [[ $(./collatz 27) != 111 || $(./collatz 1) != 0 ]]; then
    echo "FAIL: /src/collatz gives wrong answers"
    ok=0
fi
if [[ $(cat answer.txt 2>/dev/null) != 111 ]]; then
    echo "FAIL: answer.txt does not hold 111"
    ok=0
fi
echo "reward: $ok"
echo "{\"reward\": $ok}" > /logs/verifier/reward.json
